"""`{% conversation_entries inline_admin_formset as entries %}`: the entries of a task page's
conversation (`backend.tasks.admin_conversation`), from the turns its formset already read."""

from __future__ import annotations

from django import template
from django.contrib.admin.helpers import InlineAdminFormSet

from backend.tasks.admin_conversation import ConversationEntry
from backend.tasks.admin_conversation import conversation_entries as entries_of

register = template.Library()


@register.simple_tag
def conversation_entries(inline_admin_formset: InlineAdminFormSet) -> list[ConversationEntry]:
    formset = inline_admin_formset.formset
    return entries_of(task=formset.instance, turns=list(formset.get_queryset()))

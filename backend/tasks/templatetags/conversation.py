"""`{% conversation_entries inline_admin_formset as entries %}`: the entries of a task page's
conversation (`backend.tasks.admin_conversation`), from the turns its formset already read;
`{{ message_id|message_name }}`: a turn's name from its message id ("message 7")."""

from __future__ import annotations

from django import template
from django.contrib.admin.helpers import InlineAdminFormSet

from backend.tasks.admin_conversation import ConversationEntry
from backend.tasks.admin_conversation import conversation_entries as entries_of
from backend.tasks.models import message_name as name_of_message

register = template.Library()


@register.simple_tag
def conversation_entries(inline_admin_formset: InlineAdminFormSet) -> list[ConversationEntry]:
    formset = inline_admin_formset.formset
    return entries_of(task=formset.instance, turns=list(formset.get_queryset()))


@register.filter
def message_name(message_id: int | None) -> str:
    return name_of_message(message_id)

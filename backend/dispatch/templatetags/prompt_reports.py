"""`{% task_dispatches inline_admin_formset as dispatches %}`: a task page's prompt reports
grouped by the dispatch that built them (`backend.dispatch.admin_inlines.dispatches_of`), each
as the list shows it, from the reports its formset already read."""

from __future__ import annotations

from django import template
from django.contrib.admin.helpers import InlineAdminFormSet
from django.utils.safestring import SafeString

from backend.dispatch.admin_inlines import dispatch_entry, dispatches_of

register = template.Library()


@register.simple_tag
def task_dispatches(inline_admin_formset: InlineAdminFormSet) -> list[SafeString]:
    reports = list(inline_admin_formset.formset.get_queryset())
    return [dispatch_entry(dispatch) for dispatch in dispatches_of(reports)]

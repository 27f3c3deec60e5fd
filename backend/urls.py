"""Baton's URL map: the REST API under /api/, the Django admin under /admin/.

Errors Django answers itself (no URL matched, a disallowed Host, an unhandled exception) are
Baton's JSON error body under /api/ and Django's HTML pages elsewhere (`backend.api.errors`).
"""

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

admin.site.site_header = "Baton administration"
admin.site.site_title = "Baton"
admin.site.index_title = "Tasks, policies and prompts"

urlpatterns = [
    path("", RedirectView.as_view(url="/api/docs/", permanent=False)),
    path("admin/", admin.site.urls),
    path("api/", include("backend.api.urls")),
]

handler400 = "backend.api.errors.bad_request"
handler404 = "backend.api.errors.page_not_found"
handler500 = "backend.api.errors.server_error"

"""Baton's URL map: the REST API under /api/, the Django admin under /admin/.

Errors Django answers itself (no URL matched, a disallowed Host, an unhandled exception) are
Baton's JSON error body under /api/ and Django's HTML pages elsewhere (`backend.api.errors`).
"""

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from django.views.generic import RedirectView

admin.site.site_header = "Baton administration"
admin.site.site_title = "Baton"
admin.site.index_title = "Tasks, policies and prompts"


def no_favicon(request: HttpRequest) -> HttpResponse:
    """Browsers ask for /favicon.ico on every admin visit; Baton has none, and says so without
    a 404 warning in the server's log each time."""
    return HttpResponse(status=204)


urlpatterns = [
    path("", RedirectView.as_view(url="/api/docs/", permanent=False)),
    path("favicon.ico", no_favicon),
    path("admin/", admin.site.urls),
    path("api/", include("backend.api.urls")),
]

handler400 = "backend.api.errors.bad_request"
handler404 = "backend.api.errors.page_not_found"
handler500 = "backend.api.errors.server_error"

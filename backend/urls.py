"""Baton's URL map: the REST API under /api/, the Django admin under /admin/."""

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

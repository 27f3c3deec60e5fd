"""Baton's URLs plus `/bench/ceiling/`: a bare Django view doing two queries, the baseline a
dispatch and a request under load are compared with (`dispatch_http.py`, `dispatch.py`,
`load_profile.py`)."""

from django.http import HttpRequest, JsonResponse
from django.urls import path

from backend.tasks.models import Subtask, Task
from backend.urls import handler400, handler404, handler500
from backend.urls import urlpatterns as baton_urls

__all__ = ["handler400", "handler404", "handler500", "urlpatterns"]


def ceiling(request: HttpRequest) -> JsonResponse:
    subtask = Subtask.objects.values_list("id", "status").order_by("id").first()
    tasks = Task.objects.filter(pk=subtask[0] if subtask else 0).count()
    return JsonResponse({"subtask": subtask, "tasks": tasks})


urlpatterns = [path("bench/ceiling/", ceiling), *baton_urls]

from django.apps import AppConfig


class ArtifactsConfig(AppConfig):
    name = "backend.artifacts"
    label = "artifacts"
    verbose_name = "Artifacts"

from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "examples.shop"
    default_auto_field = "django.db.models.BigAutoField"

"""A project's own code, as a Django project using dispatch_app would write it (for the registry tests)."""

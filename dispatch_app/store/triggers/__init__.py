"""The schema's trigger SQL and migration helpers: a leaf the models import (the rest of the store is above them)."""

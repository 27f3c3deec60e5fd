"""One adapter per executor kind behind one small interface (see `base`)."""

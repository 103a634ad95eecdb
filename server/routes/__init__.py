"""HTTP routes: they translate HTTP to model calls and errors to statuses, nothing more."""

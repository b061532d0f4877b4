"""pytest plugin (entry point pytest11). Loading it imports no backend."""

"""The Celery adapter: jobs, the signal bridge, dispatch and the janitor."""

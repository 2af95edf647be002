"""The runtime fixture jobs on a Redis Sentinel broker: `sentinel://` names the sentinels, and the primary's name
is a Celery transport option, set as docs/production.md shows.

    CELERY_BROKER_URL=sentinel://127.0.0.1:26379/0 TEST_SENTINEL_MASTER=mymaster celery -A tests.apps.sentinel_app worker
"""

from __future__ import annotations

import os

from tests.apps.runtime_app import tasks

celery = tasks.celery
celery.conf.broker_transport_options["master_name"] = os.environ.get("TEST_SENTINEL_MASTER", "mymaster")

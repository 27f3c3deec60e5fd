"""Baton's settings plus one bare view (`bench/_ceiling_urls.py`): the machine's ceiling for
a request that authenticates nothing and runs two small queries, served by the same server
process as the API so both are measured under the same conditions."""

from settings import *  # noqa: F403

ROOT_URLCONF = "bench._ceiling_urls"

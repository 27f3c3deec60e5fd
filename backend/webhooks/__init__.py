"""Webhooks: a product registers a URL and Baton POSTs it, signed, when a turn ends.

Deliveries are outbox rows written in the transaction that ends the turn (`services`), and a
separate process (`manage.py deliver_webhooks`, `sender`) sends them with retries, so a slow or
dead receiver never holds up dispatch or result recording. This package sits below
`backend.tasks` in the layers: tasks tell it what ended, as plain data; it never imports them.
"""

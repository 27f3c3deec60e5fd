-- name: notify
-- Sends `payload` on `channel` to every listening process, this one's too (delivered when the
-- transaction commits). PostgreSQL's function, which the ORM has no query for.
SELECT pg_notify(%(channel)s, %(payload)s)

-- name: endpoints_hearing_task
-- The active webhook endpoints of an owner that hear a task (one for any task or one for
-- this task), newest first, with the events each hears (`webhooks.services`). Every turn
-- that ends asks it, and most owners have none (the partial index `webhook_active_owner`
-- answers).
-- Written out: the ORM's query of the same rows costs 0.51–0.53 ms of Python CPU to build
-- and read, this statement 0.09–0.11 ms (on PostgreSQL in process, an owner without
-- endpoints, 2,000 calls each, three rounds alternated), on a result report of about 6 ms of
-- Python (`bench/dispatch.py --only cpu --postgres … --cpu-report`).
-- The ORM's form (`_endpoints_by_orm`) is this statement's test oracle.
SELECT endpoint.id, endpoint.events
FROM {webhookendpoint} AS endpoint
WHERE endpoint.owner_id = %(owner_id)s
    AND endpoint.active
    AND (endpoint.task_id IS NULL OR endpoint.task_id = %(task_id)s)
ORDER BY endpoint.created_at DESC, endpoint.id DESC

-- name: record_events
-- A task's events appended to its log (`task_events.record`): as many numbers of the task's
-- sequence reserved as there are events (the UPDATE holds the task's row lock until the
-- caller commits, so the task's events commit in the order of their numbers), the events
-- inserted with them in the order given, and the task's streams notified when the caller
-- commits. No row when the task does not exist.
-- Written out: every dispatch, result report and progress post runs it, one round trip
-- where the ORM takes three (read the number, reserve it, insert). Measured with
-- `bench/dispatch.py --only cpu --postgres … --cpu-http --cpu-report --native-sessions
-- --dispatches 600 --blocks 3`, server CPU per dispatch and report, Python / PostgreSQL,
-- minimum of the blocks: 11.50 / 4.00 ms with these statements, 12.30 / 4.25 ms with the
-- statements they replace; one run each (the others failed under the machine's load), so
-- within the noise: no slower.
WITH numbered AS (
    UPDATE {task}
    SET next_event_seq = next_event_seq + cardinality(%(types)s::text[])
    WHERE id = %(task_id)s
    RETURNING id, next_event_seq - cardinality(%(types)s::text[]) AS first_seq
),
written AS (
    INSERT INTO {taskevent} (task_id, seq, type, subtask_id, data, created_at)
    SELECT numbered.id, numbered.first_seq + listed.position - 1, listed.type,
           listed.subtask_id, listed.data, %(now)s
    FROM numbered
    CROSS JOIN unnest(%(types)s::text[], %(subtask_ids)s::bigint[], %(data)s::jsonb[])
        WITH ORDINALITY AS listed (type, subtask_id, data, position)
    RETURNING task_id
)
SELECT pg_notify(%(channel)s, CAST(task_id AS text))
FROM (SELECT DISTINCT task_id FROM written) AS announced

-- name: record_claims
-- The `turn.claimed` events of the turns a claim took (`task_events.record_claims`) and the
-- rows written along with them (a dispatch's prompt reports: `%(along)s`, a JSON array of
-- rows of `{along_table}`, whose identity numbers them; none is `[]`, with any table), its
-- parts in this order, each reading the one before: the claimed turns' tasks locked; the
-- turns still RUNNING read under a share lock (a turn a cancel changed while this waited
-- for its task's lock is read as the cancel left it) and counted per task; exactly that many
-- of each task's numbers reserved and, unless the task was cancelled, its status set to
-- RUNNING (by the same UPDATE: one statement cannot change a row twice); the events
-- inserted, numbered in message order; the tasks' streams notified when it commits. A task
-- none of whose claimed turns still runs reserves no number. The rows along are inserted by
-- the same statement: they commit with the events, or neither does.
-- Written out: every dispatch runs it, one round trip where the ORM takes six (the rows
-- along, then read, reserve, update and insert, in a transaction of their own). Measured
-- with `bench/dispatch.py --only cpu --postgres … --dispatches 400 --blocks 2` (a dispatch
-- in process, minimum of the blocks, two runs each, alternated): Python / PostgreSQL CPU
-- per dispatch 2.84–2.85 / 1.90–2.05 ms with the reports inserted here, 4.0–4.5 /
-- 2.4–2.6 ms with the ORM's insert of them and the ORM's steps in a transaction before it.
WITH claimed AS (
    SELECT *
    FROM unnest(
        %(task_ids)s::bigint[], %(subtask_ids)s::bigint[], %(message_ids)s::bigint[],
        %(data)s::jsonb[]
    ) AS claimed (task_id, subtask_id, message_id, data)
),
along AS (
    INSERT INTO {along_table} OVERRIDING USER VALUE
    SELECT * FROM jsonb_populate_recordset(NULL::{along_table}, %(along)s::jsonb)
),
locked AS (
    SELECT id FROM {task} WHERE id = ANY(%(task_ids)s::bigint[]) FOR NO KEY UPDATE
),
running AS (
    SELECT turn.id, turn.task_id
    FROM {subtask} AS turn
    JOIN locked ON locked.id = turn.task_id
    WHERE turn.id = ANY(%(subtask_ids)s::bigint[]) AND turn.status = {turn_running}
    FOR SHARE OF turn
),
counted AS (
    SELECT task_id, COUNT(*) AS reserved FROM running GROUP BY task_id
),
numbered AS (
    UPDATE {task}
    SET next_event_seq = {task}.next_event_seq + counted.reserved,
        status = CASE WHEN {task}.status <> {task_cancelled} THEN {task_running}
                      ELSE {task}.status END,
        updated_at = CASE WHEN {task}.status <> {task_cancelled} THEN %(now)s
                          ELSE {task}.updated_at END
    FROM counted
    WHERE {task}.id = counted.task_id
    RETURNING {task}.id, {task}.next_event_seq - counted.reserved AS first_seq
),
written AS (
    INSERT INTO {taskevent} (task_id, seq, type, subtask_id, data, created_at)
    SELECT claimed.task_id,
           numbered.first_seq - 1
               + ROW_NUMBER() OVER (PARTITION BY claimed.task_id ORDER BY claimed.message_id),
           {claimed_event}, claimed.subtask_id, claimed.data, %(now)s
    FROM claimed
    JOIN numbered ON numbered.id = claimed.task_id
    JOIN running ON running.id = claimed.subtask_id
    RETURNING task_id
)
SELECT pg_notify(%(channel)s, CAST(task_id AS text))
FROM (SELECT DISTINCT task_id FROM written) AS announced

-- name: latest_round_statuses
-- The statuses of the turns of the task's latest round (marker false), and a row with marker
-- true when a message of the task is queued: every result report asks. The latest round is
-- the one started last, that of the task's highest-numbered answer (a round's answers are
-- numbered when it starts), not that of its highest-numbered USER message: a steer that
-- fell back to the queue was numbered when it was sent, and its round may start later. The
-- ORM's query (`status._latest_round_rows_by_orm`) is SQLite's path and the test oracle.
-- Measured in process on PostgreSQL (bench/dispatch.py --only cpu --cpu-report --native-sessions
-- --dispatches 200 --blocks 1, under cProfile): the ORM's UNION of a Subquery and a queued
-- part cost 1.11 s of 221 reports against 0.06 s for this statement.
SELECT DISTINCT turn.status, false AS marker
FROM {subtask} AS turn
WHERE turn.task_id = %(task_id)s
  AND turn.role = {assistant_role}
  AND turn.parent_message_id = (
    SELECT latest.parent_message_id
    FROM {subtask} AS latest
    WHERE latest.task_id = %(task_id)s AND latest.role = {assistant_role}
      AND latest.kind = {turn_kind}
    ORDER BY latest.message_id DESC
    LIMIT 1
  )
UNION ALL
SELECT '', true
WHERE EXISTS (
  SELECT 1 FROM {queuedmessage} AS queued
  WHERE queued.task_id = %(task_id)s AND queued.status = {queued}
)

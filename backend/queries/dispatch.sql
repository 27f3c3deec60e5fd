-- name: claim_turns
-- Claim up to %(limit)s of the oldest PENDING assistant turns (and summary jobs) of these
-- executor kinds that this worker may take now, in one round trip: the subquery locks the
-- rows it picks and skips those another claim has locked (FOR UPDATE SKIP LOCKED), and the
-- UPDATE changes exactly those, so each turn goes to one caller. The picking is the ORM's
-- `claims._candidates` (its test oracle): past any retry backoff, and not held for the
-- worker of the bot's native session unless that hold is over; a turn only when no turn of
-- its task runs or stands before it in line (`claims._first_of_its_task`: a task runs one
-- turn at a time, so one task's state never fails the batch; summary jobs run beside),
-- which reads the few active rows of the candidate's task (`subtask_active_per_task`). Its
-- cost is inside the noise: 849 and 736 claims/s against 677 and 795 without it
-- (`bench/dispatch.py --only claims`, 20,000 turns, 8 workers, alternated, 2026-12-07).
-- Returns, oldest first, each claimed turn as the payload reads it (`payload.CLAIMED_FIELDS`
-- in the model's field order, as the UPDATE returns them, then every column of its task,
-- then every column of its bot's native session in the task, for a turn, not a summary
-- job), the configuration version and
-- whether a RUNNING turn's lease ran out before %(now)s; on one row of NULL turn columns
-- when nothing was claimed (the claimed rows are LEFT JOINed to one row).
-- Statuses and roles are written in: a generic plan reads the partial indexes
-- `subtask_dispatch_order` and `subtask_running_lease` only when their predicates'
-- constants are in the text.
-- Kept written out: a claim, a configuration read, a session read and the lease check in
-- one round trip on every dispatch, which the ORM would send as four statements. What a
-- dispatch and its result report cost: beside `lock_claimed_turn`.
WITH claimed AS (
    UPDATE {subtask}
    SET status = {running},
        claimed_by_id = %(claimed_by_id)s::integer,
        lease_owner = %(worker_id)s::text,
        lease_expires_at = %(lease_expires_at)s::timestamptz,
        started_at = %(now)s::timestamptz,
        updated_at = %(now)s::timestamptz,
        not_before = NULL,
        attempts = attempts + 1
    WHERE id IN (
        SELECT id
        FROM {subtask} AS candidate
        WHERE status = {pending}
          AND role = {assistant}
          AND pending_since IS NOT NULL
          AND executor = ANY(%(kinds)s::text[])
          AND (not_before IS NULL OR not_before <= %(now)s::timestamptz)
          AND (
              session_worker = ''
              OR session_worker = %(worker_id)s::text
              OR pending_since <= %(affinity_over)s::timestamptz
          )
          AND (
              kind <> {turn}
              OR NOT EXISTS (
                  SELECT FROM {subtask} AS other
                  WHERE other.task_id = candidate.task_id
                    AND other.kind = {turn}
                    AND (
                        other.status = {running}
                        OR other.status = {pending}
                        AND (other.pending_since, other.id)
                            < (candidate.pending_since, candidate.id)
                    )
              )
          )
        ORDER BY pending_since, id
        LIMIT %(limit)s::integer
        FOR UPDATE SKIP LOCKED
    )
    RETURNING
        id, task_id, kind, message_id, parent_message_id, role, status, sender, bot,
        pipeline_step, executor, context_passing, error, error_code, usage,
        native_session_id, pending_since, claimed_by_id, lease_owner, lease_expires_at,
        attempts, releases, not_before, token_cap, context_overflows, session_worker,
        progress_events, partial_text, partial_text_chars, partial_text_bytes,
        progress_updated_at, history_text_tokens,
        history_text_tokens_o200k, history_chars, history_bytes, history_lines,
        history_tokens, history_tokens_estimated, history_replaced_chars, artifact_id,
        history_is_preview, result_value_in_artifact, recorded_at, summary_first_message_id,
        summary_last_message_id, summary_previous_id, created_at, updated_at, started_at,
        finished_at, stop_confirmed_at, steered_into_message_id, steers_open
)
SELECT
    claimed.*,
    task.id, task.owner_id, task.title, task.task_type, task.is_group_chat, task.status,
    task.follow_up_strategy, task.pipeline, task.next_message_id, task.next_event_seq,
    task.transcript_id, task.turn_index_id, task.created_at, task.updated_at,
    task.summary_id,
    session.id, session.task_id, session.bot, session.executor, session.session_id,
    session.worker_id, session.seen_through_message_id, session.seen_message_ids,
    session.context_tokens, session.turns, session.created_at, session.updated_at,
    (SELECT value FROM {configurationversion} WHERE id = 1) AS configuration_version,
    EXISTS (
        SELECT 1
        FROM {subtask}
        WHERE status = {running} AND lease_expires_at < %(now)s::timestamptz
    ) AS lease_ran_out
FROM (VALUES (1)) AS one
LEFT JOIN (
    claimed
    JOIN {task} AS task ON task.id = claimed.task_id
    LEFT JOIN {nativesession} AS session
        ON session.task_id = claimed.task_id
        AND session.bot = claimed.bot
        AND session.executor = claimed.executor
        AND claimed.kind = {turn}
) ON true
ORDER BY claimed.pending_since, claimed.id;

-- name: record_prompt_sent
-- After a result: mark which of the prompts a dispatch built (the full one, a resume one)
-- was sent, and why a resume prompt was or was not, and return each prompt's kind with the
-- turns it held (what the session has now seen). The ORM's update and read of the same
-- rows are `sessions.record_session`'s SQLite path and this statement's test oracle.
-- Kept written out: one statement on every result report instead of an update and a read,
-- the function 1.6x faster in-process (median of 6 alternated rounds of 200 calls on
-- PostgreSQL: 17.9 ms against 29.2 ms under load, `record_session` alone).
UPDATE {promptreport}
SET sent = (kind = %(sent_kind)s::text),
    resume_reason = CASE WHEN kind = {resume} THEN %(resume_reason)s::text
                         ELSE resume_reason END
WHERE subtask_id = %(subtask_id)s::bigint AND attempt = %(attempt)s::integer
RETURNING kind, included_message_ids;

-- name: lock_claimed_turn
-- A report's turn and its task, both rows locked, in one round trip: the ASSISTANT turn
-- %(subtask_id)s, held by the worker account %(claimed_by_id)s (any account when NULL, for a
-- claim its dispatch's PromptReport names). Returns every column of the turn, then every
-- column of its task, each in the model's field order; no row when no such turn.
-- `FOR UPDATE OF task, turn` locks the task row first, then the turn: the order every writer
-- of a task's turns uses (`leases.claimed_turn`), so concurrent writers queue instead of
-- deadlocking. The ORM's two locking reads of the same rows are `leases.claimed_turn`'s
-- SQLite path and this statement's test oracle.
-- Kept written out: every heartbeat, progress and result report runs it (the hottest path).
-- In process on PostgreSQL, 200 calls (median of 5, two alternated runs): `claimed_turn`
-- 26.8 ms against 43.5 ms for the ORM's two locking reads, `reports.heartbeat` 112 ms
-- against 133 ms. Over HTTP, a dispatch and its result report naming a session cost the
-- server's Python 5.35 ms (PostgreSQL 2.05 ms) with this statement, `native_session_of` and
-- `record_native_session`, and 7.40 ms (2.10 ms) with the ORM's reads and writes in their
-- place (medians of 3 alternated runs' block minima,
-- `bench/dispatch.py --only cpu --cpu-http --cpu-report --native-sessions --dispatches 600
-- --blocks 3`).
SELECT
    turn.id, turn.task_id, turn.kind, turn.message_id, turn.parent_message_id, turn.role,
    turn.status, turn.sender, turn.bot, turn.pipeline_step, turn.executor,
    turn.context_passing, turn.message, turn.result, turn.error, turn.error_code,
    turn.usage, turn.native_session_id, turn.pending_since, turn.claimed_by_id,
    turn.lease_owner, turn.lease_expires_at, turn.attempts, turn.releases, turn.not_before,
    turn.token_cap, turn.context_overflows, turn.session_worker, turn.progress_events,
    turn.partial_text, turn.partial_text_chars, turn.partial_text_bytes,
    turn.progress_updated_at, turn.history_text,
    turn.history_text_tokens, turn.history_text_tokens_o200k, turn.preview_head,
    turn.preview_tail, turn.preview_layout, turn.history_chars, turn.history_bytes,
    turn.history_lines, turn.history_tokens, turn.history_tokens_estimated,
    turn.history_replaced_chars, turn.artifact_id, turn.history_is_preview,
    turn.result_value_in_artifact, turn.recorded_at, turn.summary_first_message_id,
    turn.summary_last_message_id, turn.summary_previous_id, turn.created_at,
    turn.updated_at, turn.started_at, turn.finished_at, turn.stop_confirmed_at,
    turn.steered_into_message_id, turn.steers_open,
    task.id, task.owner_id, task.title, task.task_type, task.is_group_chat, task.status,
    task.follow_up_strategy, task.pipeline, task.next_message_id, task.next_event_seq,
    task.transcript_id, task.turn_index_id, task.created_at, task.updated_at,
    task.summary_id
FROM {subtask} AS turn
JOIN {task} AS task ON task.id = turn.task_id
WHERE turn.id = %(subtask_id)s::bigint
  AND turn.role = {assistant}
  AND (%(claimed_by_id)s::integer IS NULL OR turn.claimed_by_id = %(claimed_by_id)s::integer)
FOR UPDATE OF task, turn;

-- name: native_session_of
-- The native session of bot %(bot)s on executor %(executor)s in task %(task_id)s (at most one
-- row: a task holds one session per bot and executor), every column in the model's field
-- order. The ORM's read of the same row is `sessions.record_session`'s SQLite path and this
-- statement's test oracle.
-- Kept written out: every result report naming a session runs it. With
-- `record_native_session`, in process on PostgreSQL, 200 calls of `record_session` starting
-- a session (median of 5, two alternated runs): 40.7 ms against 50.8 ms for the ORM's read
-- and insert; 200 more resuming it: 89 ms against 99 ms for both.
SELECT
    session.id, session.task_id, session.bot, session.executor, session.session_id,
    session.worker_id, session.seen_through_message_id, session.seen_message_ids,
    session.context_tokens, session.turns, session.created_at, session.updated_at
FROM {nativesession} AS session
WHERE session.task_id = %(task_id)s::bigint
  AND session.bot = %(bot)s::text
  AND session.executor = %(executor)s::text;

-- name: record_native_session
-- After a result: write what the native session of bot %(bot)s on executor %(executor)s in
-- task %(task_id)s has now seen, inserting the session or updating the task's one row of
-- that bot and executor (`native_session_per_bot`). Runs under the task's lock, after
-- `native_session_of` read the row. The ORM's insert or update of the one row
-- (`sessions._write_session`) is the SQLite path and this statement's test oracle.
-- Kept written out: every result report naming a session runs it (figures beside
-- `native_session_of`); one statement for either write, where the ORM's save runs its
-- field hooks and signals.
INSERT INTO {nativesession} AS session (
    task_id, bot, executor, session_id, worker_id, seen_through_message_id, seen_message_ids,
    context_tokens, turns, created_at, updated_at
)
VALUES (
    %(task_id)s::bigint, %(bot)s::text, %(executor)s::text, %(session_id)s::text,
    %(worker_id)s::text, %(seen_through_message_id)s::integer, %(seen_message_ids)s::jsonb,
    %(context_tokens)s::integer, %(turns)s::integer, %(now)s::timestamptz,
    %(now)s::timestamptz
)
ON CONFLICT (task_id, bot, executor) DO UPDATE
SET session_id = EXCLUDED.session_id,
    worker_id = EXCLUDED.worker_id,
    seen_through_message_id = EXCLUDED.seen_through_message_id,
    seen_message_ids = EXCLUDED.seen_message_ids,
    context_tokens = EXCLUDED.context_tokens,
    turns = EXCLUDED.turns,
    updated_at = EXCLUDED.updated_at;

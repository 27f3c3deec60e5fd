-- name: transcript_parts
-- The sealed parts' rows of a batch of tasks, each task's long parts and then its short ones
-- in order (`tasks.transcripts.sealing.sealed_parts`); the JSON columns as their text, the key
-- of the built part a process keeps. Every dispatch of a long task reads them. Kept written
-- out: 0.39-0.61 ms a call of `sealed_parts` against the ORM's 1.2-1.7 ms (conversations of 200
-- and 1,000 rounds, 4 and 20 parts; median of 200 calls, alternated, on PostgreSQL: a timing
-- of `sealed_parts` and `transcripts_for` beside the setup of
-- `bench/dispatch.py --only transcripts`).
SELECT
    task_id,
    span,
    number,
    first_message_id,
    last_message_id,
    message_runs::text,
    turns,
    users,
    assistants,
    is_group_chat,
    multi_bot,
    builder_version,
    pieces::text
FROM {transcriptpart}
WHERE task_id = ANY(%(task_ids)s)
ORDER BY task_id, span DESC, number;

-- name: transcript_tails
-- Each task's turns with a message id in its range (after its last usable sealed part and
-- before its request's message), of the kinds and statuses given, with their artifacts'
-- manifest columns and a steered USER turn's target's bot, by task and message id (`tasks.transcripts.reading._tails`); the ranges
-- are three arrays, one element a task, so the text is the same for every batch. Every
-- dispatch of a long task reads them. Kept written out: a dispatch's transcript read
-- (`transcripts_for`, both statements) takes 1.4-2.0 ms against the ORM's 4.8-8.7 ms, measured
-- as for `transcript_parts`.
SELECT
    turn.task_id,
    turn.message_id,
    turn.role,
    turn.status,
    turn.sender,
    turn.bot,
    turn.history_text,
    turn.history_is_preview,
    turn.preview_head,
    turn.preview_tail,
    turn.preview_layout,
    turn.history_chars,
    turn.artifact_id,
    artifact.kind,
    artifact.size_chars,
    artifact.size_lines,
    turn.id,
    artifact.sha256,
    artifact.size_bytes,
    turn.steered_into_message_id,
    steered_into.bot
FROM unnest(%(task_ids)s::bigint[], %(after)s::bigint[], %(before)s::bigint[])
    AS wanted (task_id, after_id, before_id)
JOIN {subtask} AS turn
    ON turn.task_id = wanted.task_id
    AND turn.message_id > wanted.after_id
    AND turn.message_id < wanted.before_id
LEFT JOIN {artifact} AS artifact ON artifact.id = turn.artifact_id
LEFT JOIN {subtask} AS steered_into
    ON steered_into.task_id = turn.task_id
    AND steered_into.message_id = turn.steered_into_message_id
WHERE turn.kind = %(kind)s AND turn.status = ANY(%(statuses)s)
ORDER BY turn.task_id, turn.message_id;

-- name: transcript_parts
-- The sealed parts' rows of a batch of tasks, each task's long parts and then its short ones
-- in order (`tasks.transcripts.sealing.sealed_parts`); the JSON columns as their text, the key
-- of the built part a process keeps. Every dispatch of a long task reads them. Kept written
-- out: 0.39 / 0.49 ms a call against the ORM's 1.0 / 4.1 ms (200 rounds, 4 parts), 0.54-0.66
-- against 1.5-4.6 ms (1,000 rounds, 20 parts), alternated, on PostgreSQL
-- (/tmp/h3/bench_reads.py, see the report of issue 36).
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
-- manifest columns, by task and message id (`tasks.transcripts.reading._tails`); the ranges
-- are three arrays, one element a task, so the text is the same for every batch. Every
-- dispatch of a long task reads them. Kept written out: with the parts' read, 0.84-0.90 ms a
-- dispatch's transcript read against the ORM's 3.5-12.6 ms (200 rounds), 1.4-2.1 ms against
-- 6.7-12.9 ms (1,000 rounds), alternated, on PostgreSQL (/tmp/h3/bench_reads.py).
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
    artifact.size_bytes
FROM unnest(%(task_ids)s::bigint[], %(after)s::bigint[], %(before)s::bigint[])
    AS wanted (task_id, after_id, before_id)
JOIN {subtask} AS turn
    ON turn.task_id = wanted.task_id
    AND turn.message_id > wanted.after_id
    AND turn.message_id < wanted.before_id
LEFT JOIN {artifact} AS artifact ON artifact.id = turn.artifact_id
WHERE turn.kind = %(kind)s AND turn.status = ANY(%(statuses)s)
ORDER BY turn.task_id, turn.message_id;

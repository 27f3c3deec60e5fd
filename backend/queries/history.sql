-- name: history_selection
-- The rows a batch of prompts is built from (`backend.tasks.history.selection`), in one
-- statement. Each request (the arrays `task_ids` … `per_message_max_chars`, one element per
-- request that wants a history) gets its window of history turns, newest first: its newest
-- `max_messages` turns, an index range read backwards and stopped at the cap
-- (`subtask_message_id_unique`), or without that cap every turn whose newer turns (each
-- counted at most `per_message_max_chars`) leave room under `max_chars`. It gets its history's
-- totals by role: the counts of the transcript's sealed parts before its message plus the
-- turns after them, so neither the window nor the totals cost more as the history grows. Each
-- (task, message) of `anchor_task_ids` / `anchor_message_ids` and each summary of
-- `summary_ids` is an anchor. A row is a picked turn (`part` 'window' or 'anchor') with its
-- artifact and, for a steered USER turn, the bot of the turn it was given to (found among the
-- task's turns by message_id), or a task's totals ('totals'); a window turn's message is not
-- sent.
-- `{request_count}`, `{anchor_count}` and `{summary_count}` are the arrays' lengths, in the text so that the plan
-- PostgreSQL keeps for the prepared statement counts the rows they give: told only of the
-- arrays, it assumes 100 elements each, finds that plan dearer than one for the values given
-- and plans again on every run (EXPLAIN: 0.57 ms planning against 0.12 ms running).
-- The ORM's form (`_selected_by_orm`) is this statement's test oracle.
WITH request AS (
    SELECT *
    FROM unnest(
        %(task_ids)s::bigint[],
        %(current_ids)s::integer[],
        %(max_messages)s::integer[],
        %(max_chars)s::integer[],
        %(per_message_max_chars)s::integer[]
    ) AS request (task_id, current_id, max_messages, max_chars, per_message_max_chars)
    LIMIT {request_count}
),
picked AS (
    SELECT 'window' AS part, newest.id, request.task_id, 0 AS users, 0 AS assistants
    FROM request
    CROSS JOIN LATERAL (
        SELECT ranked.id
        FROM (
            SELECT
                turn.id,
                SUM(
                    LEAST(
                        LENGTH(turn.history_text),
                        COALESCE(request.per_message_max_chars, LENGTH(turn.history_text))
                    )
                ) OVER (
                    ORDER BY turn.message_id DESC
                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
                ) AS newer_chars
            FROM {subtask} AS turn
            WHERE turn.task_id = request.task_id
                AND turn.message_id < request.current_id
                AND turn.kind = {turn_kind}
                AND turn.status IN ({completed}, {failed}, {interrupted})
            ORDER BY turn.message_id DESC
            LIMIT request.max_messages
        ) AS ranked
        -- Under a character cap the newest turn always comes, and no text that cannot fit.
        WHERE request.max_messages IS NOT NULL
            OR request.max_chars IS NULL
            OR ranked.newer_chars IS NULL
            OR ranked.newer_chars <= request.max_chars
    ) AS newest

    UNION ALL

    SELECT
        'totals',
        NULL,
        request.task_id,
        sealed.users + counted.users,
        sealed.assistants + counted.assistants
    FROM request
    CROSS JOIN LATERAL (
        SELECT
            COALESCE(SUM(part.users), 0) AS users,
            COALESCE(SUM(part.assistants), 0) AS assistants,
            COALESCE(MAX(part.last_message_id), 0) AS last_message_id
        FROM {transcriptpart} AS part
        WHERE part.task_id = request.task_id
            AND part.last_message_id < request.current_id
            -- A short part counts only after the long parts: one a long part covers is not
            -- removed yet.
            AND (
                part.span = %(long_span)s
                OR part.first_message_id > COALESCE(
                    (
                        SELECT MAX(long_part.last_message_id)
                        FROM {transcriptpart} AS long_part
                        WHERE long_part.task_id = request.task_id
                            AND long_part.span = %(long_span)s
                    ),
                    0
                )
            )
    ) AS sealed
    CROSS JOIN LATERAL (
        SELECT
            COUNT(*) FILTER (WHERE turn.role = {user_role}) AS users,
            COUNT(*) FILTER (WHERE turn.role = {assistant_role}) AS assistants
        FROM {subtask} AS turn
        WHERE turn.task_id = request.task_id
            AND turn.message_id < request.current_id
            AND turn.message_id > sealed.last_message_id
            AND turn.kind = {turn_kind}
            AND turn.status IN ({completed}, {failed}, {interrupted})
    ) AS counted

    UNION ALL

    SELECT 'anchor', turn.id, turn.task_id, 0, 0
    FROM (
        SELECT *
        FROM unnest(%(anchor_task_ids)s::bigint[], %(anchor_message_ids)s::integer[])
            AS anchor (task_id, message_id)
        LIMIT {anchor_count}
    ) AS anchor
    JOIN {subtask} AS turn
        ON turn.task_id = anchor.task_id AND turn.message_id = anchor.message_id

    UNION ALL

    SELECT 'anchor', turn.id, turn.task_id, 0, 0
    FROM (
        SELECT * FROM unnest(%(summary_ids)s::bigint[]) AS summary (id) LIMIT {summary_count}
    ) AS summary
    JOIN {subtask} AS turn ON turn.id = summary.id
)
SELECT
    picked.part,
    picked.task_id,
    picked.users,
    picked.assistants,
    turn.id,
    turn.task_id,
    turn.message_id,
    turn.parent_message_id,
    turn.kind,
    turn.role,
    turn.status,
    turn.sender,
    turn.bot,
    CASE WHEN picked.part = 'anchor' THEN turn.message END,
    turn.history_text,
    turn.history_text_tokens,
    turn.history_text_tokens_o200k,
    turn.history_chars,
    turn.preview_head,
    turn.preview_tail,
    turn.preview_layout,
    turn.history_is_preview,
    turn.summary_first_message_id,
    turn.summary_last_message_id,
    turn.steered_into_message_id,
    turn.artifact_id,
    artifact.id,
    artifact.kind,
    artifact.size_chars,
    artifact.size_lines,
    steered_into.bot
FROM picked
LEFT JOIN {subtask} AS turn ON turn.id = picked.id
LEFT JOIN {artifact} AS artifact ON artifact.id = turn.artifact_id
LEFT JOIN {subtask} AS steered_into
    ON steered_into.task_id = turn.task_id
    AND steered_into.message_id = turn.steered_into_message_id
ORDER BY picked.part, picked.task_id, turn.message_id DESC

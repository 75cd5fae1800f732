-- 0021_conversations: conversations of `agentbox chat`, each message written as it happens (the
-- user's question, the model's reply with its tool calls, each call's result), so that a crash
-- or an interrupt loses nothing and `agentbox chat --resume` goes on from the last one.
-- principal owns a conversation (another principal is told it does not exist). endpoint is the
-- model's base URL, never a key: no column holds one. tools and tool_calls are JSON text. Times
-- are unix milliseconds.

CREATE TABLE conversations (
    id                TEXT PRIMARY KEY,
    principal         TEXT NOT NULL DEFAULT 'admin',
    title             TEXT NOT NULL DEFAULT '',
    model             TEXT NOT NULL DEFAULT '',
    endpoint          TEXT NOT NULL DEFAULT '',
    sandbox_id        TEXT NOT NULL DEFAULT '',
    tools             TEXT NOT NULL DEFAULT '[]',
    messages          BIGINT NOT NULL DEFAULT 0,
    prompt_tokens     BIGINT NOT NULL DEFAULT 0,
    completion_tokens BIGINT NOT NULL DEFAULT 0,
    created_at        BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL
);

CREATE INDEX conversations_principal_idx ON conversations (principal, created_at, id);
CREATE INDEX conversations_created_idx ON conversations (created_at, id);

CREATE TABLE conversation_messages (
    conversation_id   TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    seq               BIGINT NOT NULL,
    role              TEXT NOT NULL,
    content           TEXT NOT NULL DEFAULT '',
    tool_calls        TEXT NOT NULL DEFAULT '[]',
    tool_call_id      TEXT NOT NULL DEFAULT '',
    tool              TEXT NOT NULL DEFAULT '',
    is_error          BIGINT NOT NULL DEFAULT 0,
    truncated         BIGINT NOT NULL DEFAULT 0,
    output_bytes      BIGINT NOT NULL DEFAULT 0,
    prompt_tokens     BIGINT NOT NULL DEFAULT 0,
    completion_tokens BIGINT NOT NULL DEFAULT 0,
    duration_ms       BIGINT NOT NULL DEFAULT 0,
    model             TEXT NOT NULL DEFAULT '',
    created_at        BIGINT NOT NULL,
    PRIMARY KEY (conversation_id, seq)
);

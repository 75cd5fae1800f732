package wire

import "time"

// TokenRequest is the body of POST /v1/machines/tokens (both optional).
type TokenRequest struct {
	// Expires is how long the token is good for, a Go duration (default the server's).
	Expires string `json:"expires,omitempty"`
	// Uses is how many enrollments it allows (default 1).
	Uses int `json:"uses,omitempty"`
}

// JoinToken is a join token as replies carry it: never its secret.
type JoinToken struct {
	ID        string     `json:"token_id"`
	Prefix    string     `json:"prefix"` // the secret's first characters, to recognise it
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt time.Time  `json:"expires_at"`
	Uses      int        `json:"uses"`      // how many enrollments it allowed
	UsesLeft  int        `json:"uses_left"` // how many it still allows
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// CreatedToken is the reply of POST /v1/machines/tokens: the new token and, once, its secret.
type CreatedToken struct {
	Token JoinToken `json:"token"`
	// Secret is what `agentbox join URL --token SECRET` takes: shown now and never again.
	Secret string `json:"secret"`
}

// JoinTokenList is the reply of GET /v1/machines/tokens: the tokens without their secrets.
type JoinTokenList struct {
	Tokens []JoinToken `json:"tokens"`
}

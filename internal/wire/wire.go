// Package wire holds the request and reply types of agentbox's REST API: what goes over the
// wire, apart from the domain and store types the server keeps (internal/api converts between
// them, next to its handlers). It imports only the standard library and the error codes, so the
// CLI's client (internal/api/client) depends on nothing of the server.
package wire

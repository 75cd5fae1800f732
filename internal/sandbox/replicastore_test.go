package sandbox_test

import (
	"testing"

	"github.com/agentbox/agentbox/internal/lease"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/store/postgres"
	"github.com/agentbox/agentbox/internal/testenv/pglab"
)

// replicaStore is one replica's handle on the shared store.
type replicaStore interface {
	sandbox.Store
	sandbox.PoolStore
	lease.Store
	sandbox.ChangeNotifier
}

// openReplicaStores opens n handles (each its own connection pool, as n server processes
// would have) on one fresh Postgres database (pglab: a throwaway server, or
// AGENTBOX_TEST_POSTGRES), and the leases they share: the store's own.
func openReplicaStores(t *testing.T, n int) ([]replicaStore, lease.Store) {
	t.Helper()
	dsn := pglab.DSN(t)
	var out []replicaStore
	for range n {
		st, err := postgres.Open(t.Context(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		out = append(out, st)
	}
	return out, out[0]
}

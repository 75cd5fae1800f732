package sandbox

// snapshotDir is where snapshot id's files are. PLACEHOLDER until cp-snap's branch lands with
// the real method of this name (snapshot directories under the state dir): drop this file at
// that merge. Until then GetSnapshot is a stub, so no diff reaches it.
func (s *Service) snapshotDir(id string) string { return "/nonexistent/agentbox-snapshots/" + id }

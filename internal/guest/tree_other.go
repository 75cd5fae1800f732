//go:build unix && !linux

package guest

// Exec tags need /proc; elsewhere a timeout kills the command's process group only.

type execTags struct{}

func (*execTags) acquire() uint32   { return 0 }
func (*execTags) release(uint32)    {}
func bootTicks() uint64             { return 0 }
func killTagged(uint32, uint64) int { return 0 }

// members needs /proc: elsewhere the tree is its process group.
func (c *cmdTree) members() (map[int]byte, bool) { return nil, false }

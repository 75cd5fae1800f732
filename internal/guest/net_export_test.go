package guest

// ListenersOverParked makes c's net sessions take the agent's listeners over parked
// connections (what an older host asks for) rather than with the session's reply.
func ListenersOverParked(c *Client) { c.parkedListeners = true }

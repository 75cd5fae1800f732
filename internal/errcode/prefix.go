package errcode

// Prefixed returns err with prefix put before its message, its code and details kept (the
// field a nested check failed on, say); an error without a code is returned as is.
func Prefixed(prefix string, err error) error {
	e, ok := As(err)
	if !ok {
		return err
	}
	out := *e
	out.Message = prefix + e.Message
	out.Cause = err
	return &out
}

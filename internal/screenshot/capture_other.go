//go:build !linux && !darwin && !windows

package screenshot

import "context"

func capture(context.Context, *int) (*Shot, error) {
	return nil, noDisplay("screenshots are supported on Linux (X11), macOS and Windows machines only")
}

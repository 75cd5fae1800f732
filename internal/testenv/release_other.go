//go:build !linux

package testenv

func releaseMounts(string) {}

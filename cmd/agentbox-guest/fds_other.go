//go:build !linux

package main

func closeInheritedFDs() {}

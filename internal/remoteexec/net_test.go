package remoteexec_test

import "net"

type (
	netConn   = net.Conn
	netDialer = net.Dialer
)

// Command etcd is etcd's server at the version kubernetes' own go.mod pins (go.etcd.io/etcd/server/v3),
// built in the same tool module as kube-apiserver so the cluster needs no etcd package.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }

package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/agentbox/agentbox/internal/api/client"
	"github.com/agentbox/agentbox/internal/errcode"
	"github.com/agentbox/agentbox/internal/sandbox"
	"github.com/agentbox/agentbox/internal/sandbox/pools"
	"github.com/agentbox/agentbox/internal/wire"
)

// Warm pools: `agentbox pool set|ls|rm` and serve's --pool.

// poolFlags is serve's warm-pool flags: the repeatable --pool name=…,image=…,size=N and
// --max-pooled.
type poolFlags struct {
	pools     poolValues
	maxPooled int
}

// poolList collects the --pool values.
type poolValues []sandbox.Pool

func (p *poolValues) String() string { return fmt.Sprint(len(*p), " pools") }

func (p *poolValues) Set(v string) error {
	pool, err := pools.ParseFlag(v)
	if err != nil {
		return fmt.Errorf("%s", errcode.Message(err))
	}
	*p = append(*p, pool)
	return nil
}

// registerPoolFlags adds --pool and --max-pooled to serve's flags.
func registerPoolFlags(fs *flag.FlagSet) *poolFlags {
	var p poolFlags
	fs.IntVar(&p.maxPooled, "max-pooled", 0, "most sandboxes all warm pools together may keep (they count against --max-sandboxes, which bounds it; default half of --max-sandboxes)")
	fs.Var(&p.pools, "pool", "a warm pool, repeatable: name=NAME,size=N[,image=I][,runtime=R][,cpu=C][,memory_mb=M][,disk_mb=D][,network=none|egress] "+
		"(set at start, replacing the stored pool of that name; pools set at run time persist too)")
	return &p
}

// apply sets the flags' pools on svc (validated as pool_set does).
func (p *poolFlags) apply(ctx context.Context, svc *pools.Service) error {
	for _, pool := range p.pools {
		if _, err := svc.SetPool(ctx, pool); err != nil {
			return fmt.Errorf("--pool name=%s: %w", pool.Name, err)
		}
	}
	return nil
}

func cmdPool(args []string) int {
	const subs = "set, ls, rm"
	if len(args) == 0 {
		fmt.Fprintf(os.Stderr, "usage: agentbox pool %s ...\n", strings.ReplaceAll(subs, ", ", "|"))
		return 2
	}
	sub := map[string]func([]string) int{"set": poolSet, "ls": poolList, "list": poolList, "rm": poolRemove, "delete": poolRemove}
	if f, ok := sub[args[0]]; ok {
		return f(args[1:])
	}
	fmt.Fprintf(os.Stderr, "agentbox pool: unknown subcommand %q (%s)\n", args[0], subs)
	return 2
}

func poolSet(args []string) int {
	c := newClientCmd("pool set", "agentbox pool set NAME --size N [--image I] [--runtime R] [--cpu C] [--memory-mb M] [--disk-mb D] [--json]")
	var p wire.Pool
	size := c.fs.Int("size", -1, "how many ready sandboxes the pool keeps (required; 0 parks it)")
	c.fs.StringVar(&p.Image, "image", "", "image (default: the server's)")
	c.fs.StringVar(&p.Runtime, "runtime", "", "runtime (default: the server's)")
	c.fs.Float64Var(&p.CPU, "cpu", 0, "CPU limit in cores (default: the server's)")
	c.fs.Int64Var(&p.MemoryMB, "memory-mb", 0, "memory limit in MiB (default: the server's)")
	c.fs.Int64Var(&p.DiskMB, "disk-mb", 0, "disk size in MiB (default: the server's)")
	c.fs.StringVar(&p.Network, "network", "", "none (the default) or egress (for creates with a network policy; each claimant's policy and secrets apply at its claim)")
	return c.run(args, exactly(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		if *size < 0 {
			fmt.Fprintln(os.Stderr, "agentbox pool set: --size is required (0 or more)")
			return 2
		}
		p.Name, p.Size = pos[0], *size
		st, err := cl.SetPool(ctx, p)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(st)
			return 0
		}
		fmt.Printf("pool %s: %d ready of %d (%s on %s, %g cpu, %d MiB memory, %d MiB disk)\n",
			st.Name, st.Ready, st.Size, st.Image, st.Runtime, st.CPU, st.MemoryMB, st.DiskMB)
		return 0
	})
}

func poolList(args []string) int {
	c := newClientCmd("pool ls", "agentbox pool ls [--json]")
	return c.run(args, exactly(0), func(ctx context.Context, cl *client.Client, _ []string) int {
		l, err := cl.ListPools(ctx)
		if err != nil {
			return fail(err)
		}
		if c.json {
			printJSON(l)
			return 0
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tREADY\tSIZE\tSTARTING\tHITS\tMISSES\tIMAGE\tRUNTIME\tCPU\tMEMORY_MB\tDISK_MB\tLAST ERROR")
		for _, p := range l.Pools {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%g\t%d\t%d\t%s\n", p.Name, p.Ready, p.Size, p.Starting, p.Hits, p.Misses,
				p.Image, p.Runtime, p.CPU, p.MemoryMB, p.DiskMB, p.LastError)
		}
		tw.Flush()
		return 0
	})
}

func poolRemove(args []string) int {
	c := newClientCmd("pool rm", "agentbox pool rm NAME...")
	return c.run(args, atLeast(1), func(ctx context.Context, cl *client.Client, pos []string) int {
		rc := 0
		for _, name := range pos {
			if err := cl.DeletePool(ctx, name); err != nil {
				rc = fail(err)
				continue
			}
			fmt.Println("deleted pool", name)
		}
		return rc
	})
}

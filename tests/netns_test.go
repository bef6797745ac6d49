package tests

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// Network namespaces of the partition test. Names are nsPrefix + the test
// process's pid + "-" + role, so leftovers of a crashed run (whose pid is
// gone) can be found and deleted without touching a concurrent run's.
const nsPrefix = "avt"

// testSubnet is the private /16 the partition test addresses live in. It
// exists only inside the namespaces the test makes: nothing on the host
// routes to it, and no traffic leaves them.
const testSubnet = "10.199"

// partitionNet is three namespaces: db (sqld) linked to a and to b by one
// veth pair each, forwarding between them so a and b can nudge each other.
//
//	ns a: va 10.199.1.2/24 ── vad 10.199.1.1/24 :ns db: vbd 10.199.2.1/24 ── vb 10.199.2.2/24 ns b
type partitionNet struct {
	t              *testing.T
	db, a, b       string // namespace names
	linkA, linkB   string // instance-side veth ends
	dbForA, dbForB string // sqld's address as a and b reach it
	addrA, addrB   string // the instances' own addresses
}

// requireNetns skips (loudly) where namespaces cannot be made: not root,
// or no `ip`. Under CI=true it fails instead: CI must run the test.
func requireNetns(t *testing.T) {
	t.Helper()
	why := ""
	if _, err := exec.LookPath("ip"); err != nil {
		why = "no `ip` command (install iproute2)"
	} else if os.Geteuid() != 0 {
		why = "not running as root"
	} else if out, err := exec.Command("ip", "netns", "add", nsName("probe")).CombinedOutput(); err != nil {
		why = fmt.Sprintf("ip netns add failed: %v: %s", err, strings.TrimSpace(string(out)))
	} else {
		_ = exec.Command("ip", "netns", "del", nsName("probe")).Run()
		return
	}
	msg := "!!! PARTITION TEST NOT RUN: network namespaces cannot be created here (" + why + ") !!!"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + " — CI must run it")
	}
	t.Skip(msg)
}

func nsName(role string) string { return fmt.Sprintf("%s%d-%s", nsPrefix, os.Getpid(), role) }

// deleteLeftoverNamespaces deletes namespaces of earlier runs whose test
// process no longer exists.
func deleteLeftoverNamespaces(t *testing.T) {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], nsPrefix) {
			continue
		}
		pidPart, _, ok := strings.Cut(strings.TrimPrefix(f[0], nsPrefix), "-")
		pid, err := strconv.Atoi(pidPart)
		if !ok || err != nil {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil && pid != os.Getpid() {
			continue // a concurrent run's
		}
		if err := exec.Command("ip", "netns", "del", f[0]).Run(); err == nil {
			t.Logf("deleted leftover namespace %s", f[0])
		}
	}
}

// ip runs `ip args...` and fails the test on error.
func ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// in runs `ip netns exec ns args...` and fails the test on error.
func in(t *testing.T, ns string, args ...string) {
	t.Helper()
	ip(t, append([]string{"netns", "exec", ns}, args...)...)
}

// newPartitionNet builds the three namespaces; they are deleted when the
// test ends, whatever its outcome. Call it before starting any process
// inside them, so their cleanups (which stop the processes) run first.
func newPartitionNet(t *testing.T) *partitionNet {
	t.Helper()
	requireNetns(t)
	deleteLeftoverNamespaces(t)
	pid := os.Getpid()
	n := &partitionNet{t: t, db: nsName("db"), a: nsName("a"), b: nsName("b"),
		linkA: fmt.Sprintf("va%d", pid), linkB: fmt.Sprintf("vb%d", pid),
		dbForA: testSubnet + ".1.1", dbForB: testSubnet + ".2.1",
		addrA: testSubnet + ".1.2", addrB: testSubnet + ".2.2"}
	for _, ns := range []string{n.db, n.a, n.b} {
		ip(t, "netns", "add", ns)
		t.Cleanup(func() {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				t.Errorf("delete namespace %s: %v: %s", ns, err, out)
			}
		})
		in(t, ns, "ip", "link", "set", "lo", "up")
	}
	for _, side := range []struct{ ns, link, addr, dbAddr string }{
		{n.a, n.linkA, n.addrA, n.dbForA}, {n.b, n.linkB, n.addrB, n.dbForB},
	} {
		peer := side.link + "d"
		ip(t, "link", "add", side.link, "type", "veth", "peer", "name", peer)
		ip(t, "link", "set", side.link, "netns", side.ns)
		ip(t, "link", "set", peer, "netns", n.db)
		in(t, side.ns, "ip", "addr", "add", side.addr+"/24", "dev", side.link)
		in(t, side.ns, "ip", "link", "set", side.link, "up")
		in(t, side.ns, "ip", "route", "add", "default", "via", side.dbAddr)
		in(t, n.db, "ip", "addr", "add", side.dbAddr+"/24", "dev", peer)
		in(t, n.db, "ip", "link", "set", peer, "up")
	}
	in(t, n.db, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")
	return n
}

// wrap is the command prefix that runs a process inside ns.
func wrap(ns string) []string { return []string{"ip", "netns", "exec", ns} }

// cutA takes a's link down: a reaches nothing, b and sqld are untouched.
func (n *partitionNet) cutA() { in(n.t, n.a, "ip", "link", "set", n.linkA, "down") }

// healA brings a's link back, with the route a link-down removed.
func (n *partitionNet) healA() {
	in(n.t, n.a, "ip", "link", "set", n.linkA, "up")
	in(n.t, n.a, "ip", "route", "replace", "default", "via", n.dbForA)
}

package balance_test

import (
	"cmp"
	"slices"
	"sort"
)

// frac is a fraction num/den.
type frac struct{ num, den int }

// fractionalShares is the oracle for the bound: what each balancing node
// would hold if buckets could be split among the nodes that declare them,
// as evenly as the declarations allow (the lexicographically fairest
// fractional assignment). It peels the fleet layer by layer: the smallest
// share λ that every remaining node can stay within is the density of the
// fleet's densest part, found by a max-flow per candidate λ; the nodes that
// cannot shed load to a node under λ form that part, get λ, and leave with
// the buckets only they declare.
func fractionalShares(movable map[int][]string, load map[string]int) map[string]frac {
	out := map[string]frac{}
	nodes := map[string]bool{}
	for id := range load {
		nodes[id] = true
	}
	buckets := map[int][]string{}
	for b, el := range movable {
		buckets[b] = slices.Clone(el)
	}
	for len(nodes) > 0 {
		if len(buckets) == 0 {
			for id := range nodes {
				out[id] = frac{0, 1}
			}
			break
		}
		ids := make([]string, 0, len(nodes))
		for id := range nodes {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		var cands []frac
		for den := 1; den <= len(ids); den++ {
			for num := 0; num <= len(buckets); num++ {
				cands = append(cands, frac{num, den})
			}
		}
		slices.SortFunc(cands, func(a, b frac) int { return cmp.Compare(a.num*b.den, b.num*a.den) })
		i := sort.Search(len(cands), func(i int) bool {
			ok, _ := fits(buckets, ids, cands[i])
			return ok
		})
		lambda := cands[i]
		_, tight := fits(buckets, ids, lambda)
		if len(tight) == 0 {
			panic("the densest part at the smallest share that fits is empty")
		}
		for _, id := range tight {
			out[id] = lambda
			delete(nodes, id)
		}
		for b, el := range buckets {
			left := el[:0]
			for _, id := range el {
				if nodes[id] {
					left = append(left, id)
				}
			}
			if len(left) == 0 {
				delete(buckets, b)
			} else {
				buckets[b] = left
			}
		}
	}
	return out
}

// fits reports whether every bucket can be split among the nodes that
// declare it with no node over lambda, and, when it can, the nodes that
// cannot give any of their load to a node under lambda (the tight part).
func fits(buckets map[int][]string, ids []string, lambda frac) (bool, []string) {
	bs := make([]int, 0, len(buckets))
	for b := range buckets {
		bs = append(bs, b)
	}
	slices.Sort(bs)
	index := map[string]int{}
	for i, id := range ids {
		index[id] = i
	}
	// Vertices: source, the buckets, the nodes, sink. Capacities are
	// scaled by lambda.den so that they are whole.
	src, sink := 0, 1+len(bs)+len(ids)
	g := newFlow(sink + 1)
	for i, b := range bs {
		g.edge(src, 1+i, lambda.den)
		for _, id := range buckets[b] {
			g.edge(1+i, 1+len(bs)+index[id], lambda.den)
		}
	}
	nodeEdge := make([]int, len(ids))
	for i := range ids {
		nodeEdge[i] = g.edge(1+len(bs)+i, sink, lambda.num)
	}
	if g.maxFlow(src, sink) < lambda.den*len(bs) {
		return false, nil
	}
	// From a node, the residual graph leads to the buckets that send it
	// load, and from them to every node that declares them.
	reach := func(from int) []bool {
		seen := make([]bool, len(g.adj))
		stack := []int{from}
		seen[from] = true
		for len(stack) > 0 {
			v := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			for _, e := range g.adj[v] {
				if g.cap[e] > 0 && !seen[g.to[e]] && g.to[e] != src && g.to[e] != sink {
					seen[g.to[e]] = true
					stack = append(stack, g.to[e])
				}
			}
		}
		return seen
	}
	var tight []string
	for i, id := range ids {
		v := 1 + len(bs) + i
		if g.cap[nodeEdge[i]] > 0 {
			continue // under lambda
		}
		seen := reach(v)
		shed := false
		for j := range ids {
			if seen[1+len(bs)+j] && g.cap[nodeEdge[j]] > 0 {
				shed = true
				break
			}
		}
		if !shed {
			tight = append(tight, id)
		}
	}
	return true, tight
}

// flow is a max-flow network (Dinic's algorithm) with residual edges in
// pairs: edge e and e^1.
type flow struct {
	adj        [][]int
	to, cap    []int
	level, its []int
}

func newFlow(n int) *flow { return &flow{adj: make([][]int, n)} }

func (g *flow) edge(from, to, c int) int {
	e := len(g.to)
	g.to, g.cap = append(g.to, to, from), append(g.cap, c, 0)
	g.adj[from] = append(g.adj[from], e)
	g.adj[to] = append(g.adj[to], e+1)
	return e
}

func (g *flow) maxFlow(s, t int) int {
	total := 0
	for g.bfs(s, t) {
		g.its = make([]int, len(g.adj))
		for {
			f := g.dfs(s, t, int(^uint(0)>>1))
			if f == 0 {
				break
			}
			total += f
		}
	}
	return total
}

func (g *flow) bfs(s, t int) bool {
	g.level = make([]int, len(g.adj))
	for i := range g.level {
		g.level[i] = -1
	}
	g.level[s] = 0
	queue := []int{s}
	for len(queue) > 0 {
		v := queue[0]
		queue = queue[1:]
		for _, e := range g.adj[v] {
			if g.cap[e] > 0 && g.level[g.to[e]] < 0 {
				g.level[g.to[e]] = g.level[v] + 1
				queue = append(queue, g.to[e])
			}
		}
	}
	return g.level[t] >= 0
}

func (g *flow) dfs(v, t, f int) int {
	if v == t {
		return f
	}
	for ; g.its[v] < len(g.adj[v]); g.its[v]++ {
		e := g.adj[v][g.its[v]]
		if g.cap[e] > 0 && g.level[g.to[e]] == g.level[v]+1 {
			if d := g.dfs(g.to[e], t, min(f, g.cap[e])); d > 0 {
				g.cap[e] -= d
				g.cap[e^1] += d
				return d
			}
		}
	}
	return 0
}

// minHandoffs is the oracle for stickiness: the fewest buckets that must
// leave their holders for the balancing nodes to reach the loads of a (a
// min-cost flow: a bucket costs 1 when it goes to a node other than its
// holder).
func minHandoffs(movable map[int][]string, holders map[int]string, loads map[string]int) int {
	bs := make([]int, 0, len(movable))
	for b := range movable {
		bs = append(bs, b)
	}
	slices.Sort(bs)
	ids := make([]string, 0, len(loads))
	for id := range loads {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	index := map[string]int{}
	for i, id := range ids {
		index[id] = i
	}
	src, sink := 0, 1+len(bs)+len(ids)
	g := newCostFlow(sink + 1)
	for i, b := range bs {
		g.edge(src, 1+i, 1, 0)
		for _, id := range movable[b] {
			cost := 1
			if holders[b] == id {
				cost = 0
			}
			g.edge(1+i, 1+len(bs)+index[id], 1, cost)
		}
	}
	for i, id := range ids {
		g.edge(1+len(bs)+i, sink, loads[id], 0)
	}
	flow, cost := g.run(src, sink)
	if flow != len(bs) {
		panic("the loads given cannot be reached")
	}
	return cost
}

type costFlow struct {
	adj           [][]int
	to, cap, cost []int
}

func newCostFlow(n int) *costFlow { return &costFlow{adj: make([][]int, n)} }

func (g *costFlow) edge(from, to, c, cost int) {
	e := len(g.to)
	g.to, g.cap, g.cost = append(g.to, to, from), append(g.cap, c, 0), append(g.cost, cost, -cost)
	g.adj[from] = append(g.adj[from], e)
	g.adj[to] = append(g.adj[to], e+1)
}

// run sends as much flow as it can at the least cost (successive shortest
// paths, found by a queue-driven Bellman-Ford on the residual graph, which
// has no negative cycle).
func (g *costFlow) run(s, t int) (flow, cost int) {
	const inf = int(^uint(0) >> 2)
	for {
		dist := make([]int, len(g.adj))
		via := make([]int, len(g.adj))
		for i := range dist {
			dist[i], via[i] = inf, -1
		}
		dist[s] = 0
		queued := make([]bool, len(g.adj))
		queue := []int{s}
		queued[s] = true
		for len(queue) > 0 {
			v := queue[0]
			queue = queue[1:]
			queued[v] = false
			for _, e := range g.adj[v] {
				if w := g.to[e]; g.cap[e] > 0 && dist[v]+g.cost[e] < dist[w] {
					dist[w], via[w] = dist[v]+g.cost[e], e
					if !queued[w] {
						queued[w] = true
						queue = append(queue, w)
					}
				}
			}
		}
		if dist[t] == inf {
			return flow, cost
		}
		push := inf
		for v := t; v != s; v = g.to[via[v]^1] {
			push = min(push, g.cap[via[v]])
		}
		for v := t; v != s; v = g.to[via[v]^1] {
			g.cap[via[v]] -= push
			g.cap[via[v]^1] += push
		}
		flow += push
		cost += push * dist[t]
	}
}

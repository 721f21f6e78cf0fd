package outbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceonly/onceonly/keystate"
)

// Distribution is how the engine's tables are laid out.
//
// On a distributed database (Citus, docs/citus.md), idempotency_keys and outbox
// are distributed by scope and co-located (migration 00009), so the rows of
// one scope, keys and events, are on one shard. A statement that names its
// scope (scope = @scope) runs on that shard's worker, as one Postgres would
// run it; one that spans scopes runs on every shard, where Citus refuses
// FOR UPDATE, SKIP LOCKED and ctid, and where writes commit in two phases.
// So on such a database the store runs what spans scopes scope by scope: a
// read of every shard (no lock) finds the scopes with work, then each
// scope's statement runs on its shard, in a transaction of its own (the
// relay's take, the reaper, the resumer, retention, claim batches and
// lease renewals). Session settings a statement needs on the shard
// (lock_timeout, synchronous_commit) go as SET LOCAL, which Citus passes
// on to the workers with citus.propagate_set_commands = 'local'.
//
// On one Postgres the statements are those of before: none of this costs
// it anything.
type Distribution int32

const (
	// DetectDistribution makes the store ask the database, once, before
	// the first statement that differs.
	DetectDistribution Distribution = iota
	// SingleNode is one Postgres (or a Citus database whose tables are not
	// distributed).
	SingleNode
	// ByScope is Citus with idempotency_keys and outbox distributed by
	// scope.
	ByScope
)

// String names d.
func (d Distribution) String() string {
	switch d {
	case SingleNode:
		return "single node"
	case ByScope:
		return "distributed by scope"
	case DetectDistribution:
	}
	return "not detected"
}

// Distribution returns how the tables are laid out: Config.Distribution,
// or else what db says, asked once (citus_installed, citus_distributed)
// and kept.
func (s *Store) Distribution(ctx context.Context, db Querier) (Distribution, error) {
	if d := Distribution(s.dist.Load()); d != DetectDistribution {
		return d, nil
	}
	var installed, distributed bool
	if err := citusInstalledSQL.queryRow(ctx, db, nil).Scan(&installed); err != nil {
		return DetectDistribution, fmt.Errorf("detect distribution: %w", err)
	}
	if installed {
		if err := citusDistributedSQL.queryRow(ctx, db, nil).Scan(&distributed); err != nil {
			return DetectDistribution, fmt.Errorf("detect distribution: %w", err)
		}
	}
	d := SingleNode
	if distributed {
		d = ByScope
	}
	s.dist.CompareAndSwap(int32(DetectDistribution), int32(d))
	return Distribution(s.dist.Load()), nil
}

// byScope reports whether the tables are distributed by scope.
func (s *Store) byScope(ctx context.Context, db Querier) (bool, error) {
	d, err := s.Distribution(ctx, db)
	return d == ByScope, err
}

// PrepareSession readies conn for a single-commit execution: the store
// knows the distribution and the key lock secret (QueueSingleBegin needs
// both), and the session's keepalives are set (SetKeepalives). Each costs
// nothing once done.
func (s *Store) PrepareSession(ctx context.Context, conn *pgx.Conn) error {
	if _, err := s.Distribution(ctx, conn); err != nil {
		return err
	}
	if err := s.LoadLockSecret(ctx, conn); err != nil {
		return err
	}
	return s.SetKeepalives(ctx, conn)
}

// The SET LOCAL statements a scope's transaction starts with on a
// distributed database. SET LOCAL, not set_config: Citus passes on only
// SET commands to the workers' sessions, once citus.propagate_set_commands
// is 'local'. They take no parameters, so their values are written in.
const (
	setPropagateLocal = "SET LOCAL citus.propagate_set_commands = 'local'"
	setAsyncCommit    = "SET LOCAL synchronous_commit = off"
)

// setLockTimeout is the SET LOCAL of lock_timeout d (in milliseconds).
func setLockTimeout(d time.Duration) string {
	return "SET LOCAL lock_timeout = " + strconv.FormatInt(max(d.Milliseconds(), 1), 10)
}

// queueBegin queues on b the BEGIN of a scope's transaction and its
// settings.
func queueBegin(b *pgx.Batch, settings ...string) {
	b.Queue("BEGIN")
	if len(settings) > 0 {
		b.Queue(setPropagateLocal)
		for _, s := range settings {
			b.Queue(s)
		}
	}
}

// batchSender returns db as a BatchSender, or an error naming what needs
// one.
func batchSender(db DB, what string) (BatchSender, error) {
	sender, ok := db.(BatchSender)
	if !ok {
		return nil, fmt.Errorf("%s on a distributed database: %T sends no batch", what, db)
	}
	return sender, nil
}

// scopeGroup is the indexes of the items of one scope.
type scopeGroup struct {
	scope   string
	indexes []int
}

// groupByScope groups the n items by their scope, in the order each scope
// first appears.
func groupByScope(n int, scopeOf func(int) string) []scopeGroup {
	var groups []scopeGroup
	index := map[string]int{}
	for i := range n {
		scope := scopeOf(i)
		g, ok := index[scope]
		if !ok {
			g = len(groups)
			index[scope] = g
			groups = append(groups, scopeGroup{scope: scope})
		}
		groups[g].indexes = append(groups[g].indexes, i)
	}
	return groups
}

// scopes runs one of the statements that find the scopes with work
// (outbox_scopes, reapable_scopes, …): a read of every shard, no lock.
func scopes(ctx context.Context, db DB, st *statement, args pgx.StrictNamedArgs) ([]string, error) {
	rows, err := st.query(ctx, db, args)
	if err != nil {
		return nil, fmt.Errorf("find the scopes: %w", err)
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("find the scopes: %w", err)
	}
	return found, nil
}

// scopeQueue is the scopes the relay takes events from next, on a
// distributed database: filled by outbox_scopes when empty, each scope
// once. A scope whose take came back full goes back at the end, so the
// relays take the scopes in turn.
type scopeQueue struct {
	mu     sync.Mutex
	scopes []string
	queued map[string]bool
}

// pop takes the next scope.
func (q *scopeQueue) pop() (string, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.scopes) == 0 {
		return "", false
	}
	scope := q.scopes[0]
	q.scopes = q.scopes[1:]
	delete(q.queued, scope)
	return scope, true
}

// push adds the scopes not queued yet, at the end.
func (q *scopeQueue) push(scopes ...string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.queued == nil {
		q.queued = map[string]bool{}
	}
	for _, scope := range scopes {
		if !q.queued[scope] {
			q.queued[scope] = true
			q.scopes = append(q.scopes, scope)
		}
	}
}

// takeByScope is TakeBatch on a distributed database: the events of one
// scope, the next of s.outboxScopes, on that scope's shard, with FOR
// UPDATE SKIP LOCKED and ctid inside it. Several relays still never take
// the same event: the locks are the shard's, as on one Postgres. A scope
// whose events others hold, or that has none left, gives way to the next;
// when the queue runs out, outbox_scopes fills it once.
func (s *Store) takeByScope(ctx context.Context, db BatchDB, limit, maxBody int) (pgx.Tx, Batch, error) {
	found := false
	for ctx.Err() == nil {
		scope, ok := s.outboxScopes.pop()
		if !ok {
			if found {
				return nil, Batch{}, nil
			}
			found = true
			next, err := scopes(ctx, db, outboxScopesSQL, pgx.StrictNamedArgs{"limit": limit})
			if err != nil {
				return nil, Batch{}, fmt.Errorf("take outbox events: %w", err)
			}
			s.outboxScopes.push(next...)
			continue
		}
		// take_batch's set_config runs on the shard's worker, or on the
		// coordinator, as Citus plans it: SET LOCAL sets both.
		tx, batch, err := s.take(ctx, db, takeBatchSQL.byScope,
			pgx.StrictNamedArgs{"limit": limit, "max_body": maxBody, "scope": scope}, limit, setAsyncCommit)
		if err != nil {
			s.outboxScopes.push(scope) // its events wait
			return nil, Batch{}, err
		}
		if len(batch.Events) == limit {
			s.outboxScopes.push(scope) // more may wait, after the other scopes
		}
		if tx != nil {
			return tx, batch, nil
		}
	}
	return nil, Batch{}, fmt.Errorf("take outbox events: %w", ctx.Err())
}

// claimNewByScope is ClaimNew on a distributed database: one statement per
// scope, each in a transaction of its own on its shard (no commit across
// shards), all in one round trip. lock_timeout and the commit without a
// flush wait are set by SET LOCAL, so they hold on the shard's session,
// where a claim waits for another transaction's insert.
func (s *Store) claimNewByScope(ctx context.Context, db DB, reqs []ClaimRequest, args pgx.StrictNamedArgs, lockTimeout time.Duration, claimed map[keystate.Owner]keystate.Key) error {
	sender, err := batchSender(db, "claim keys")
	if err != nil {
		return err
	}
	settings := []string{setAsyncCommit}
	if s.cfg.DeferNotify {
		// With a NOTIFY, as claim_batch, no lock_timeout: the NOTIFY's
		// commit waits for a database-wide lock, which a lock_timeout
		// would turn into failed batches under load.
		settings = append(settings, setLockTimeout(lockTimeout))
	}
	var b pgx.Batch
	for _, g := range groupByScope(len(reqs), func(i int) string { return reqs[i].Ref.Scope }) {
		group := make([]ClaimRequest, len(g.indexes))
		for j, i := range g.indexes {
			group[j] = reqs[i]
		}
		groupArgs := maps.Clone(args)
		s.setBatchArgs(groupArgs, group)
		queueBegin(&b, settings...)
		claimBatchSQL.byScope.queue(&b, groupArgs).Query(func(rows pgx.Rows) error { return scanClaimed(rows, claimed) })
		b.Queue("COMMIT")
	}
	if err := sender.SendBatch(ctx, &b).Close(); err != nil {
		return fmt.Errorf("claim keys: %w", err)
	}
	return nil
}

// renewByScope is RenewLeases on a distributed database: one statement per
// scope, on its shard, each in a transaction of its own (a renewal that
// spanned shards would commit in two phases: measured, it missed 3 s
// leases under load), all in one round trip.
func (s *Store) renewByScope(ctx context.Context, db DB, leases []Lease, lease time.Duration, held map[keystate.Owner]bool) error {
	groups := groupByScope(len(leases), func(i int) string { return leases[i].Ref.Scope })
	var b pgx.Batch
	for _, g := range groups {
		n := len(g.indexes)
		scopes, keys, owners := make([]string, n), make([]string, n), make([]string, n)
		for j, i := range g.indexes {
			scopes[j], keys[j], owners[j] = leases[i].Ref.Scope, leases[i].Ref.Key, leases[i].Owner.String()
		}
		args := pgx.StrictNamedArgs{"scopes": scopes, "keys": keys, "owners": owners, "lease": lease, "scope": g.scope}
		if len(groups) > 1 {
			queueBegin(&b)
		}
		renewLeasesSQL.byScope.queue(&b, args).Query(func(rows pgx.Rows) error { return scanHeld(rows, held) })
		if len(groups) > 1 {
			b.Queue("COMMIT")
		}
	}
	sender, err := batchSender(db, "renew leases")
	if err != nil {
		return err
	}
	if err := sender.SendBatch(ctx, &b).Close(); err != nil {
		return fmt.Errorf("renew leases: %w", err)
	}
	return nil
}

// reapByScope is ReapLeases on a distributed database: reap_leases scope by
// scope, each on its shard, for the scopes reapable_scopes finds, until
// limit keys are reaped. The relays are notified from the coordinator
// (a statement on a shard would notify on its worker, where no relay
// listens).
func (s *Store) reapByScope(ctx context.Context, db DB, grace time.Duration, limit int) (int, error) {
	found, err := scopes(ctx, db, reapableScopesSQL, pgx.StrictNamedArgs{"grace": grace, "limit": limit})
	if err != nil {
		return 0, fmt.Errorf("reap leases: %w", err)
	}
	total := 0
	for _, scope := range found {
		if total >= limit {
			break
		}
		var n int
		var notified bool
		err := reapLeasesSQL.byScope.queryRow(ctx, db, pgx.StrictNamedArgs{"grace": grace, "ttl": s.cfg.FailedTTL,
			"limit": limit - total, "channel": NotifyChannel, "scope": scope}).Scan(&n, &notified)
		if err != nil {
			return total, fmt.Errorf("reap leases of scope %s: %w", scope, err)
		}
		total += n
	}
	if total > 0 {
		if err := s.Notify(ctx, db); err != nil {
			return total, err
		}
	}
	return total, nil
}

// deleteExpiredByScope is DeleteExpired's delete on a distributed database:
// delete_expired scope by scope, each on its shard, for the scopes
// expired_scopes finds, until limit keys are deleted.
func (s *Store) deleteExpiredByScope(ctx context.Context, db DB, limit int) (int, error) {
	found, err := scopes(ctx, db, expiredScopesSQL, pgx.StrictNamedArgs{"limit": limit})
	if err != nil {
		return 0, fmt.Errorf("delete expired keys: %w", err)
	}
	total := 0
	for _, scope := range found {
		if total >= limit {
			break
		}
		tag, err := deleteExpiredSQL.byScope.exec(ctx, db, pgx.StrictNamedArgs{"limit": limit - total, "scope": scope})
		if err != nil {
			return total, fmt.Errorf("delete expired keys of scope %s: %w", scope, err)
		}
		total += int(tag.RowsAffected())
	}
	return total, nil
}

// recordStepByScope is RecordStep on a distributed database
// (citus_record_step): an asynchronous commit is set by SET LOCAL in the
// step's own transaction, sent with it in one round trip, so it holds on
// the shard's session. Without a BatchSender it commits synchronously.
func (s *Store) recordStepByScope(ctx context.Context, db DB, args pgx.StrictNamedArgs, async bool) (bool, error) {
	var recorded bool
	scan := func(row pgx.Row) error {
		var done string
		err := row.Scan(&done)
		if err == nil {
			recorded = true
			return nil
		}
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return fmt.Errorf("read the step's row: %w", err)
	}
	sender, ok := db.(BatchSender)
	if !async || !ok {
		return recorded, scan(citusRecordStepSQL.queryRow(ctx, db, args))
	}
	var b pgx.Batch
	queueBegin(&b, setAsyncCommit)
	citusRecordStepSQL.queue(&b, args).QueryRow(scan)
	b.Queue("COMMIT")
	if err := sender.SendBatch(ctx, &b).Close(); err != nil {
		return false, fmt.Errorf("send the step's transaction: %w", err)
	}
	return recorded, nil
}

// resumeByScope is ResumeClaim on a distributed database: resume_claim
// scope by scope, each on its shard, for the scopes resumable_scopes finds,
// until every owner has an execution.
func (s *Store) resumeByScope(ctx context.Context, db DB, handlers, owners []string, lease time.Duration) ([]Resumable, error) {
	found, err := scopes(ctx, db, resumableScopesSQL, pgx.StrictNamedArgs{"handlers": handlers, "limit": len(owners)})
	if err != nil {
		return nil, fmt.Errorf("claim executions to resume: %w", err)
	}
	var out []Resumable
	for _, scope := range found {
		left := owners[len(out):]
		if len(left) == 0 {
			break
		}
		rows, err := resumeClaimSQL.byScope.query(ctx, db, pgx.StrictNamedArgs{"lease": lease, "notify": !s.cfg.DeferNotify,
			"channel": NotifyChannel, "handlers": handlers, "limit": len(left), "owners": left, "scope": scope})
		if err != nil {
			return out, fmt.Errorf("claim executions to resume in scope %s: %w", scope, err)
		}
		if out, err = scanResumable(rows, out); err != nil {
			return out, err
		}
	}
	return out, nil
}

package onceonly_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncetest"
)

// The tests of this file are of the default configuration: every
// execution begins as one commit, and its first step promotes it to
// two-phase.

// TestFirstStepPromotes: before its first step an execution has written no
// row (it holds the key by its transaction's advisory lock, Fence().Version
// 0); the step commits the claim (in progress, under the execution's owner
// and lease), and the execution goes on two-phase: its fence carries the
// row's version, its write commits with the key's completion, and a retry
// replays it.
func TestFirstStepPromotes(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	e := b.singleEngine(t, 0)
	var before, after string
	var fenceBefore, fenceAfter onceonly.Fence
	require.NoError(t, e.Register("charge", func(ctx context.Context, x *onceonly.Execution) (onceonly.Result, error) {
		before, fenceBefore = b.keyStatus(t, "k"), x.Fence()
		if _, err := onceonly.Step(ctx, "gateway", func(context.Context, string) (int, error) { return 1, nil }); err != nil {
			return onceonly.Result{}, err
		}
		after, fenceAfter = b.keyStatus(t, "k"), x.Fence()
		tx, err := onceonly.Tx(ctx)
		if err != nil {
			return onceonly.Result{}, err
		}
		return payment(201, `{"ok":true}`)(ctx, tx)
	}))
	out, err := e.Run(b.ctx, "charge", "s", "k", []byte("p"))
	require.NoError(t, err)
	require.Equal(t, "absent", before, "no row before the first step")
	require.Zero(t, fenceBefore.Version)
	require.Equal(t, "in_progress", after, "the first step committed the claim")
	require.Positive(t, fenceAfter.Version)
	require.Equal(t, fenceBefore.Owner, fenceAfter.Owner)
	require.Equal(t, "completed", b.keyStatus(t, "k"))
	require.False(t, out.Replayed)
	out, err = e.Run(b.ctx, "charge", "s", "k", []byte("p"))
	require.NoError(t, err)
	require.True(t, out.Replayed)
	require.Equal(t, 1, b.payments(t))
}

// TestLatePromotionHoldsAWholeLease: an execution that ran longer than its
// lease as one commit (carried on) before its first step holds a whole
// lease from the promotion: a duplicate just after the step is turned
// away, not handed a row whose lease counted from the transaction's start
// and ran out already.
func TestLatePromotionHoldsAWholeLease(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	b := setup(t, setupOpts{noRedis: true})
	e := b.singleEngine(t, lease)
	stepped, release := make(chan struct{}), make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseOnce)
	require.NoError(t, e.Register("late", func(ctx context.Context, x *onceonly.Execution) (onceonly.Result, error) {
		time.Sleep(6 * lease / 5) // one commit, past the lease, before its first step
		if _, err := onceonly.Step(ctx, "gateway", func(context.Context, string) (int, error) { return 1, nil }); err != nil {
			return onceonly.Result{}, err
		}
		close(stepped)
		<-release
		tx, err := onceonly.Tx(ctx)
		if err != nil {
			return onceonly.Result{}, err
		}
		return payment(201, `{}`)(ctx, tx)
	}))
	done := make(chan error, 1)
	go func() {
		_, err := e.Run(b.ctx, "late", "s", "k", []byte("p"))
		done <- err
	}()
	select {
	case <-stepped:
	case err := <-done:
		t.Fatalf("the execution ended before its step: %v", err)
	}
	twoPhase := b.engine // claims the key's row, as a consumer or an older engine would
	_, err := twoPhase.Do(b.ctx, "s", "k", []byte("p"), payment(201, `{"duplicate":true}`))
	require.True(t, isInFlight(err), "a duplicate after the late promotion: %v", err)
	releaseOnce()
	require.NoError(t, <-done)
	require.Equal(t, 1, b.payments(t))
}

// TestPromotionTurnsDuplicatesAway hammers one key, with no Redis in front,
// with a handler that steps and then writes: whether a duplicate comes
// while the first execution holds only the advisory lock, while its claim
// commits, or after, no two handlers run at once (I4 across the switch:
// the lock is held until the claim row is committed), and exactly one
// commits (I1).
func TestPromotionTurnsDuplicatesAway(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noRedis: true})
	e := b.singleEngine(t, 0)
	var running, most, effects atomic.Int32
	require.NoError(t, e.Register("charge", func(ctx context.Context, _ *onceonly.Execution) (onceonly.Result, error) {
		n := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(5 * time.Millisecond) // duplicates arrive before the step
		if _, err := onceonly.Step(ctx, "gateway", func(context.Context, string) (int, error) {
			effects.Add(1)
			return 1, nil
		}); err != nil {
			return onceonly.Result{}, err
		}
		time.Sleep(5 * time.Millisecond) // and after it
		tx, err := onceonly.Tx(ctx)
		if err != nil {
			return onceonly.Result{}, err
		}
		return payment(201, `{}`)(ctx, tx)
	}))
	for round := range 5 {
		key := fmt.Sprintf("k%d", round)
		var wg sync.WaitGroup
		var executed atomic.Int32
		for range 12 {
			wg.Go(func() {
				out, err := e.Run(b.ctx, "charge", "s", key, []byte("p"))
				switch {
				case err == nil && !out.Replayed:
					executed.Add(1)
				case err == nil, isInFlight(err):
				default:
					t.Errorf("unexpected error: %v", err)
				}
			})
		}
		wg.Wait()
		require.Equal(t, int32(1), executed.Load(), "round %d", round)
	}
	require.Equal(t, int32(1), most.Load(), "two handlers ran at once")
	require.Equal(t, int32(5), effects.Load())
	require.Equal(t, 5, b.payments(t))
}

// TestDuplicateOfAOneCommitExecutionIsInFlight: while an execution that
// never steps runs, a duplicate is turned away as in flight (the
// middleware's 409, I4): by Redis's provisional claim with Redis, by the
// key's advisory lock without it.
func TestDuplicateOfAOneCommitExecutionIsInFlight(t *testing.T) {
	t.Parallel()
	for _, noRedis := range []bool{false, true} {
		t.Run(map[bool]string{false: "Redis", true: "PostgresOnly"}[noRedis], func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{noRedis: noRedis})
			e := b.singleEngine(t, 0)
			finish := b.hold(e, "s", "k")
			_, err := e.Do(b.ctx, "s", "k", []byte("p"), payment(201, `{}`))
			require.True(t, isInFlight(err), "the duplicate: %v", err)
			require.NoError(t, finish())
			out, err := e.Do(b.ctx, "s", "k", []byte("p"), payment(201, `{}`))
			require.NoError(t, err)
			require.True(t, out.Replayed)
			require.Equal(t, 1, b.payments(t))
		})
	}
}

// TestOneCommitSlowHandlerCompletes: a handler that runs past its lease
// without a step, and leaves its transaction idle all along, is carried on
// (its lease keeper keeps the transaction alive) and completes in its one
// commit: one row, version 1, the first answer not a replay, with Redis
// and without.
func TestOneCommitSlowHandlerCompletes(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	for _, noRedis := range []bool{false, true} {
		t.Run(map[bool]string{false: "Redis", true: "PostgresOnly"}[noRedis], func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{noRedis: noRedis})
			e := b.singleEngine(t, lease)
			out, err := e.Do(b.ctx, "s", "k", []byte("p"), func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
				time.Sleep(5 * lease / 2) // a slow card network, deaf to ctx: past the lease, the transaction idle
				return payment(201, `{"slow":true}`)(ctx, tx)
			})
			require.NoError(t, err, "a slow but live execution is never ended for being slow")
			require.False(t, out.Replayed)
			require.Equal(t, 1, b.payments(t))
			var version int
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT version FROM idempotency_keys WHERE key = 'k'`).Scan(&version))
			require.Equal(t, 1, version, "one commit: the key's row was written once")
		})
	}
}

// TestSlowLiveHandlersCompleteOnce: handlers that wait a fraction of their
// lease to two and a half times it on a system outside Postgres, without a
// step, two callers each, a consumer's redelivery at once after a 409: each
// completes once, and nothing is ended for being slow.
func TestSlowLiveHandlersCompleteOnce(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	b := setup(t, setupOpts{noRedis: true})
	e, err := onceonly.New(onceonly.Config{Pool: b.poolOf(t, 32), LeaseTimeout: lease})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	var wg sync.WaitGroup
	var runs, ended atomic.Int32
	for i := range 12 {
		key := fmt.Sprintf("k%d", i)
		wait := lease*3/10 + time.Duration(i)*lease*2/10 // 0.3 to 2.5 leases
		for range 2 {
			wg.Go(func() {
				for {
					_, err := e.Do(b.ctx, "s", key, []byte("p"), func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
						runs.Add(1)
						time.Sleep(wait)
						return chargeKey(key)(ctx, tx)
					})
					if _, inFlight := onceonly.IsInFlight(err); inFlight {
						time.Sleep(50 * time.Millisecond) // a redelivery's pause, not a wait for an event
						continue
					}
					if err != nil {
						ended.Add(1)
						t.Errorf("%s: %v", key, err)
					}
					return
				}
			})
		}
	}
	wg.Wait()
	require.Zero(t, ended.Load())
	require.Equal(t, int32(12), runs.Load(), "one run per key")
	for i := range 12 {
		require.Equal(t, 1, paymentRows(t, b.ctx, b.pool, fmt.Sprintf("k%d", i)))
	}
}

// killChildEnv names the database a child process of
// TestOneCommitKilledMidHandler runs its execution on.
const killChildEnv = "ONCEONLY_TEST_KILL_CHILD_DB"

// TestOneCommitKilledMidHandler: a process killed (SIGKILL) while a
// handler that never stepped runs leaves no row behind (its transaction
// dies with its connection, the advisory lock with it), and a retry runs
// the handler once.
func TestOneCommitKilledMidHandler(t *testing.T) {
	if os.Getenv(killChildEnv) != "" {
		return // this is the child process: TestOneCommitKillChild runs
	}
	t.Parallel()
	b := setup(t, setupOpts{noRedis: true})
	cmd := exec.CommandContext(b.ctx, os.Args[0], "-test.run=^TestOneCommitKillChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), killChildEnv+"="+b.pool.Config().ConnString())
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "the child's handler to start")
	require.Equal(t, "running\n", line)
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()

	require.Equal(t, "absent", b.keyStatus(t, "k"), "a killed one-commit execution leaves no row")
	e := b.singleEngine(t, 0)
	var out onceonly.Outcome
	oncetest.Eventually(t, 10*time.Second, "Postgres to end the killed process's transaction", func() bool {
		out, err = e.Do(b.ctx, "s", "k", []byte("p"), payment(201, `{}`))
		if err != nil {
			require.True(t, isInFlight(err), "unexpected error: %v", err)
		}
		return err == nil
	})
	require.False(t, out.Replayed)
	require.Equal(t, 1, b.payments(t), "the killed handler's write is gone, the retry's committed")
}

// TestOneCommitPausedHolderBlocksNoLongerThanLease: a process paused
// (SIGSTOP) while its handler runs — after its lease keeper kept the
// transaction alive past the lease — keeps nothing alive any more: Postgres
// ends its idle transaction within the lease, and a duplicate runs then
// (I5); the paused handler's write is gone (I1).
func TestOneCommitPausedHolderBlocksNoLongerThanLease(t *testing.T) {
	if os.Getenv(killChildEnv) != "" {
		return // this is the child process: TestOneCommitKillChild runs
	}
	t.Parallel()
	const lease = time.Second
	b := setup(t, setupOpts{noRedis: true})
	cmd := exec.CommandContext(b.ctx, os.Args[0], "-test.run=^TestOneCommitKillChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), killChildEnv+"="+b.pool.Config().ConnString(), killChildLeaseEnv+"="+lease.String())
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "the child's handler to start")
	require.Equal(t, "running\n", line)

	e := b.singleEngine(t, lease)
	oncetest.Eventually(t, 10*time.Second, "the child's execution to live past its lease", func() bool {
		var idle time.Duration
		err := b.pool.QueryRow(b.ctx, `SELECT coalesce(max(now() - xact_start), '0') FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'idle in transaction'`).Scan(&idle)
		require.NoError(t, err)
		return idle > 3*lease/2
	})
	_, err = e.Do(b.ctx, "s", "k", []byte("p"), payment(201, `{}`))
	require.True(t, isInFlight(err), "the live holder keeps its key: %v", err)

	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	paused := time.Now()
	var out onceonly.Outcome
	oncetest.Eventually(t, 10*lease, "Postgres to end the paused process's transaction", func() bool {
		out, err = e.Do(b.ctx, "s", "k", []byte("p"), payment(201, `{}`))
		if err != nil {
			require.True(t, isInFlight(err), "unexpected error: %v", err)
		}
		return err == nil
	})
	took := time.Since(paused)
	require.False(t, out.Replayed)
	require.Less(t, took, lease+lease/2+time.Second, "the paused holder blocked its key past the lease")
	require.Equal(t, 1, b.payments(t), "the paused handler's write is gone, the duplicate's committed")
}

// killChildLeaseEnv is the lease of the child process's engine (a
// time.Duration; the default when unset).
const killChildLeaseEnv = "ONCEONLY_TEST_KILL_CHILD_LEASE"

// TestOneCommitKillChild is the process TestOneCommitKilledMidHandler
// kills (and TestOneCommitPausedHolderBlocksNoLongerThanLease pauses): it
// runs an execution of key k whose handler writes, says "running" and
// waits to be killed.
func TestOneCommitKillChild(t *testing.T) {
	url := os.Getenv(killChildEnv)
	if url == "" {
		t.Skip("the child process of TestOneCommitKilledMidHandler; runs only as that")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	lease, _ := time.ParseDuration(os.Getenv(killChildLeaseEnv))
	e, err := onceonly.New(onceonly.Config{Pool: pool, Logger: oncetest.QuietLogger(), LeaseTimeout: lease})
	require.NoError(t, err)
	_, _ = e.Do(ctx, "s", "k", []byte("p"), func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
		if _, err := payment(201, `{}`)(ctx, tx); err != nil {
			return onceonly.Result{}, err
		}
		fmt.Fprintln(os.Stdout, "running") // the parent waits for this line
		time.Sleep(time.Hour)              // until killed
		return onceonly.Result{}, ctx.Err()
	})
}

package keystore

import _ "embed" // the statements below are embedded from sql/

// Every statement the store runs, one whole file each under sql/, named as
// in docs/state-machine.md. Nothing assembles SQL at run time.
var (
	//go:embed sql/claim_insert.sql
	claimInsertSQL string
	//go:embed sql/claim_batch.sql
	claimBatchSQL string
	//go:embed sql/claim_peek.sql
	claimPeekSQL string
	//go:embed sql/claim_takeover.sql
	claimTakeoverSQL string
	//go:embed sql/finish.sql
	finishSQL string
	//go:embed sql/single_begin.sql
	singleBeginSQL string
	//go:embed sql/single_finish.sql
	singleFinishSQL string
	//go:embed sql/session_keepalives.sql
	sessionKeepalivesSQL string
	//go:embed sql/heartbeat.sql
	heartbeatSQL string
	//go:embed sql/get_key.sql
	getKeySQL string
	//go:embed sql/current_keys.sql
	currentKeysSQL string
	//go:embed sql/purge.sql
	purgeSQL string
	//go:embed sql/reap_leases.sql
	reapLeasesSQL string
	//go:embed sql/count_reapable.sql
	countReapableSQL string
	//go:embed sql/delete_expired.sql
	deleteExpiredSQL string
	//go:embed sql/raise_version_floor.sql
	raiseVersionFloorSQL string
	//go:embed sql/count_expired.sql
	countExpiredSQL string
	//go:embed sql/scan_live.sql
	scanLiveSQL string
	//go:embed sql/lift_statement_timeout.sql
	liftStatementTimeoutSQL string
	//go:embed sql/live_keys.sql
	liveKeysSQL string
	//go:embed sql/take_batch.sql
	takeBatchSQL string
	//go:embed sql/requeue_events.sql
	requeueEventsSQL string
	//go:embed sql/count_events.sql
	countEventsSQL string
	//go:embed sql/notify.sql
	notifySQL string
	//go:embed sql/record_step.sql
	recordStepSQL string
	//go:embed sql/hand_off.sql
	handOffSQL string
	//go:embed sql/resume_claim.sql
	resumeClaimSQL string
	//go:embed sql/renew_leases.sql
	renewLeasesSQL string
	//go:embed sql/try_lock.sql
	tryLockSQL string
)

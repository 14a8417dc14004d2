-- What a batch decided, in one statement: attempts whose state alone
-- moved (a submit, a failure report), attempts written whole (a grant),
-- leases whose expiry alone moved (a heartbeat without progress), task
-- rows whose token counter or claim column moved (a grant, a retry), the
-- receipts and the audit rows. Answers `changed`, the rows it changed.
--
-- Arguments, in the order `AcknowledgedArgs::params` builds them, one
-- array a column, one element a row written:
--   $1 to $8 the attempts whose state moved (`state_`): task, number,
--   state, until_at, lapses_at, discarded, last_error, changed_at;
--   $9 to $21 the attempts written whole (`whole_`): task, number, state,
--   until_at, tries, holder, token, granted_at, expires_at, lapses_at,
--   discarded, last_error, changed_at;
--   $22 to $25 the leases whose expiry moved (`expiry_`): task, number,
--   expires_at, lapses_at;
--   $26 to $29 the task rows (`claim_`): task, claimable_at, last_token
--   (null: unchanged), moves (whether claimable_at is written);
--   $30 to $38 the receipts (`receipt_`): task, attempt, token, principal,
--   idempotency_key, artifact, digest, accepted_at, output;
--   $39 to $45 the audit rows (`audit_`): at, principal, namespace,
--   action, outcome, resource, ip_hash.
WITH states AS (
    UPDATE attempts a SET state = u.state, until_at = u.until_at, lapses_at = u.lapses_at,
        discarded = u.discarded, last_error = u.last_error, changed_at = u.changed_at
    FROM unnest($1::bigint[] /* state_task */, $2::bigint[] /* state_number */,
        $3::text[] /* state_state */, $4::bigint[] /* state_until_at */,
        $5::bigint[] /* state_lapses_at */, $6::text[] /* state_discarded */,
        $7::text[] /* state_last_error */, $8::bigint[] /* state_changed_at */)
        AS u(task, number, state, until_at, lapses_at, discarded, last_error, changed_at)
    WHERE a.task = u.task AND a.number = u.number
    RETURNING 1
), wholes AS (
    UPDATE attempts a SET state = u.state, until_at = u.until_at, tries = u.tries,
        holder = u.holder, token = u.token, granted_at = u.granted_at,
        expires_at = u.expires_at, lapses_at = u.lapses_at, discarded = u.discarded,
        last_error = u.last_error, changed_at = u.changed_at
    FROM unnest($9::bigint[] /* whole_task */, $10::bigint[] /* whole_number */,
        $11::text[] /* whole_state */, $12::bigint[] /* whole_until_at */,
        $13::bigint[] /* whole_tries */, $14::text[] /* whole_holder */,
        $15::bigint[] /* whole_token */, $16::bigint[] /* whole_granted_at */,
        $17::bigint[] /* whole_expires_at */, $18::bigint[] /* whole_lapses_at */,
        $19::text[] /* whole_discarded */, $20::text[] /* whole_last_error */,
        $21::bigint[] /* whole_changed_at */)
        AS u(task, number, state, until_at, tries, holder, token, granted_at, expires_at,
            lapses_at, discarded, last_error, changed_at)
    WHERE a.task = u.task AND a.number = u.number
    RETURNING 1
), expiries AS (
    UPDATE attempts a SET expires_at = u.expires_at, lapses_at = u.lapses_at
    FROM unnest($22::bigint[] /* expiry_task */, $23::bigint[] /* expiry_number */,
        $24::bigint[] /* expiry_expires_at */, $25::bigint[] /* expiry_lapses_at */)
        AS u(task, number, expires_at, lapses_at)
    WHERE a.task = u.task AND a.number = u.number
    RETURNING 1
), claims AS (
    UPDATE tasks t SET last_token = coalesce(u.last_token, t.last_token),
        claimable_at = CASE WHEN u.moves THEN u.claimable_at ELSE t.claimable_at END
    FROM unnest($26::bigint[] /* claim_task */, $27::bigint[] /* claim_claimable_at */,
        $28::bigint[] /* claim_last_token */, $29::boolean[] /* claim_moves */)
        AS u(id, claimable_at, last_token, moves)
    WHERE t.id = u.id
    RETURNING 1
), receipts_added AS (
    INSERT INTO receipts (task, attempt, token, principal, idempotency_key, artifact, digest,
        accepted_at, output)
    SELECT * FROM unnest($30::bigint[] /* receipt_task */, $31::bigint[] /* receipt_attempt */,
        $32::bigint[] /* receipt_token */, $33::text[] /* receipt_principal */,
        $34::text[] /* receipt_idempotency_key */, $35::text[] /* receipt_artifact */,
        $36::text[] /* receipt_digest */, $37::bigint[] /* receipt_accepted_at */,
        $38::bytea[] /* receipt_output */)
    RETURNING 1
), audited AS (
    INSERT INTO access_audit (at, principal, namespace, action, outcome, resource, ip_hash)
    SELECT * FROM unnest($39::bigint[] /* audit_at */, $40::text[] /* audit_principal */,
        $41::text[] /* audit_namespace */, $42::text[] /* audit_action */,
        $43::text[] /* audit_outcome */, $44::text[] /* audit_resource */,
        $45::text[] /* audit_ip_hash */)
    RETURNING 1
)
SELECT (SELECT count(*) FROM states) + (SELECT count(*) FROM wholes)
    + (SELECT count(*) FROM expiries) + (SELECT count(*) FROM claims)
    + (SELECT count(*) FROM receipts_added) + (SELECT count(*) FROM audited) AS changed

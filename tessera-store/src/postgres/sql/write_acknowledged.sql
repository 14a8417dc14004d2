-- What a batch decided, in one statement: attempts whose state alone
-- moved (a failure report; a submission, with the receipt it ended the
-- attempt with), attempts written whole (a grant), leases whose expiry
-- alone moved (a heartbeat without progress), task rows whose token
-- counter or claim column moved (a grant, a retry) and the audit rows.
-- Answers `changed`, the rows it changed.
--
-- Arguments, in the order `AcknowledgedArgs::params` builds them, one
-- array a column, one element a row written:
--   $1 to $12 the attempts whose state moved (`state_`): task, number,
--   state, until_at, lapses_at, discarded, last_error, changed_at, and
--   the receipt's idempotency_key, digest, accepted_at and output (all
--   null: no receipt, the stored columns kept);
--   $13 to $25 the attempts written whole (`whole_`): task, number, state,
--   until_at, tries, holder, token, granted_at, expires_at, lapses_at,
--   discarded, last_error, changed_at;
--   $26 to $29 the leases whose expiry moved (`expiry_`): task, number,
--   expires_at, lapses_at;
--   $30 to $33 the task rows (`claim_`): task, claimable_at, last_token
--   (null: unchanged), moves (whether claimable_at is written);
--   $34 to $40 the audit rows (`audit_`): at, principal, namespace,
--   action, outcome, resource, ip_hash.
WITH states AS (
    UPDATE attempts a SET state = u.state, until_at = u.until_at, lapses_at = u.lapses_at,
        discarded = u.discarded, last_error = u.last_error, changed_at = u.changed_at,
        idempotency_key = coalesce(u.idempotency_key, a.idempotency_key),
        digest = coalesce(u.digest, a.digest),
        accepted_at = coalesce(u.accepted_at, a.accepted_at),
        output = CASE WHEN u.idempotency_key IS NULL THEN a.output ELSE u.output END
    FROM unnest($1::bigint[] /* state_task */, $2::bigint[] /* state_number */,
        $3::text[] /* state_state */, $4::bigint[] /* state_until_at */,
        $5::bigint[] /* state_lapses_at */, $6::text[] /* state_discarded */,
        $7::text[] /* state_last_error */, $8::bigint[] /* state_changed_at */,
        $9::text[] /* state_idempotency_key */, $10::text[] /* state_digest */,
        $11::bigint[] /* state_accepted_at */, $12::bytea[] /* state_output */)
        AS u(task, number, state, until_at, lapses_at, discarded, last_error, changed_at,
            idempotency_key, digest, accepted_at, output)
    WHERE a.task = u.task AND a.number = u.number
    RETURNING 1
), wholes AS (
    UPDATE attempts a SET state = u.state, until_at = u.until_at, tries = u.tries,
        holder = u.holder, token = u.token, granted_at = u.granted_at,
        expires_at = u.expires_at, lapses_at = u.lapses_at, discarded = u.discarded,
        last_error = u.last_error, changed_at = u.changed_at
    FROM unnest($13::bigint[] /* whole_task */, $14::bigint[] /* whole_number */,
        $15::text[] /* whole_state */, $16::bigint[] /* whole_until_at */,
        $17::bigint[] /* whole_tries */, $18::text[] /* whole_holder */,
        $19::bigint[] /* whole_token */, $20::bigint[] /* whole_granted_at */,
        $21::bigint[] /* whole_expires_at */, $22::bigint[] /* whole_lapses_at */,
        $23::text[] /* whole_discarded */, $24::text[] /* whole_last_error */,
        $25::bigint[] /* whole_changed_at */)
        AS u(task, number, state, until_at, tries, holder, token, granted_at, expires_at,
            lapses_at, discarded, last_error, changed_at)
    WHERE a.task = u.task AND a.number = u.number
    RETURNING 1
), expiries AS (
    UPDATE attempts a SET expires_at = u.expires_at, lapses_at = u.lapses_at
    FROM unnest($26::bigint[] /* expiry_task */, $27::bigint[] /* expiry_number */,
        $28::bigint[] /* expiry_expires_at */, $29::bigint[] /* expiry_lapses_at */)
        AS u(task, number, expires_at, lapses_at)
    WHERE a.task = u.task AND a.number = u.number
    RETURNING 1
), claims AS (
    UPDATE tasks t SET last_token = coalesce(u.last_token, t.last_token),
        claimable_at = CASE WHEN u.moves THEN u.claimable_at ELSE t.claimable_at END
    FROM unnest($30::bigint[] /* claim_task */, $31::bigint[] /* claim_claimable_at */,
        $32::bigint[] /* claim_last_token */, $33::boolean[] /* claim_moves */)
        AS u(id, claimable_at, last_token, moves)
    WHERE t.id = u.id
    RETURNING 1
), audited AS (
    INSERT INTO access_audit (at, principal, namespace, action, outcome, resource, ip_hash)
    SELECT * FROM unnest($34::bigint[] /* audit_at */, $35::text[] /* audit_principal */,
        $36::text[] /* audit_namespace */, $37::text[] /* audit_action */,
        $38::text[] /* audit_outcome */, $39::text[] /* audit_resource */,
        $40::text[] /* audit_ip_hash */)
    RETURNING 1
)
SELECT (SELECT count(*) FROM states) + (SELECT count(*) FROM wholes)
    + (SELECT count(*) FROM expiries) + (SELECT count(*) FROM claims)
    + (SELECT count(*) FROM audited) AS changed

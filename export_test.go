package onceonly

// LegacyFingerprint exposes the version 1 request fingerprint to tests, which
// store keys the way the previous version did.
var LegacyFingerprint = legacyFingerprint

// PayloadFingerprint exposes the fingerprint Do and Run take of a payload.
var PayloadFingerprint = payloadFingerprint

/**
 * JWT verification against a key set that may hold several keys a token's header matches.
 *
 * @internal
 * @module
 */
import { type JWTPayload, type JWTVerifyGetKey, type JWTVerifyOptions, errors, jwtVerify } from 'jose'

/** The most keys a token naming none is tried against (a rotation holds two or three of an algorithm). */
const MAX_CANDIDATE_KEYS = 8

/**
 * `jwtVerify` against a key set, trying in turn every key that matches the token's header when
 * there are several: a token without `kid` while the set holds two keys of its algorithm (an
 * issuer part way through a key rotation, RFC 7517 making `kid` optional). `jose` refuses such
 * a token with `JWKSMultipleMatchingKeys`, which carries the candidates, and leaves trying them
 * to its caller. A candidate whose signature does not match is passed over; any other refusal
 * (a signature that matched and a claim that did not) is the token's answer. None matching
 * among the first {@link MAX_CANDIDATE_KEYS} throws `JWSSignatureVerificationFailed`, as one
 * wrong key does.
 */
export async function jwtVerifyWithKeySet(token: string, keys: JWTVerifyGetKey, options: JWTVerifyOptions): Promise<JWTPayload> {
  try {
    return (await jwtVerify(token, keys, options)).payload
  } catch (error) {
    if (!(error instanceof errors.JWKSMultipleMatchingKeys)) throw error
    let tried = 0
    for await (const key of error) {
      // Bounded: each candidate costs a signature check, and a forged token names no key.
      if (++tried > MAX_CANDIDATE_KEYS) break
      try {
        return (await jwtVerify(token, key, options)).payload
      } catch (refused) {
        if (!(refused instanceof errors.JWSSignatureVerificationFailed)) throw refused
      }
    }
    throw new errors.JWSSignatureVerificationFailed()
  }
}

/**
 * The platform of `app.ts` as a Cloudflare Worker (a `modules` Worker), for workerd: bundled by
 * esbuild with `mcp-dispatch` and `mcp-dispatch/web` resolved to dist/, the built package
 * (`workerd.ts`). Everything is created in global scope, as a Worker's platform would be. Its
 * options come from the bindings `workerd.ts` writes into the config (text bindings, so
 * numbers are strings); `WAIT_UNTIL` set hands the library `waitUntil` of `cloudflare:workers`.
 */
import { env, waitUntil } from 'cloudflare:workers'
import * as lib from 'mcp-dispatch'
import * as web from 'mcp-dispatch/web'
import { type RuntimeAppOptions, createRuntimeApp } from './app.js'

const bindings = env as Record<string, string | undefined>
const number = (name: string) => (bindings[name] === undefined ? undefined : Number(bindings[name]))
const options: RuntimeAppOptions = {
  issuer: bindings.ISSUER,
  userinfoEndpoint: bindings.USERINFO_ENDPOINT,
  jwtIssuer: bindings.JWT_ISSUER,
  jwksMaxAgeMs: number('JWKS_MAX_AGE_MS'),
  lastUsedFlushMs: number('LAST_USED_FLUSH_MS'),
  sessionTtlMs: number('SESSION_TTL_MS'),
  ...(bindings.WAIT_UNTIL !== undefined && { waitUntil }),
}
// Undefined options are left out, so the library's defaults apply.
for (const key of Object.keys(options) as Array<keyof RuntimeAppOptions>) if (options[key] === undefined) delete options[key]

const { serve } = createRuntimeApp(lib, web, options)

export default {
  // workerd sets no client address of its own (Cloudflare's edge sends CF-Connecting-IP).
  fetch: (request: Request) => serve(request, request.headers.get('cf-connecting-ip') ?? undefined),
}

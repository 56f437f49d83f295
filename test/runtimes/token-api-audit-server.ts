/**
 * The platform of `token-api-audit-app.ts` (the source, src/, so a fix is what runs) served by
 * Bun (`Bun.serve`) or Deno (`Deno.serve`, with `--sloppy-imports`) on 127.0.0.1 at the port
 * given as its first argument, with `lastUsedFlushMs` its second. It prints `{ port }` once it
 * listens, and serves until it is killed (`test/helpers/runtime-serve.ts`).
 */
import * as lib from '../../src/index.js'
import * as web from '../../src/adapters/web/index.js'
import { runtimeArgs, serveOnRuntime } from '../helpers/runtime-serve.js'
import { withTestHost } from './app.js'
import { createAuditApp } from './token-api-audit-app.js'

const args = runtimeArgs()
const { serve } = createAuditApp(lib, web, { lastUsedFlushMs: Number(args[1] ?? 60_000) })

serveOnRuntime('test/runtimes/token-api-audit-server.ts', (request, clientAddress) => serve(withTestHost(request), clientAddress), Number(args[0]))

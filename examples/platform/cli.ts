/**
 * What `npm start` (server.ts) and `npm run forward` (forwarder.ts) share on their command
 * lines: a bad option or environment variable is named on stderr, one line each, never a
 * stack trace.
 * @module
 */

/** A TCP port from an option; a bad one adds a message naming the option to `problems`. */
export function portOption(name: string, raw: string, allowZero: boolean, problems: string[]): number {
  const port = /^\d{1,5}$/.test(raw) ? Number(raw) : Number.NaN
  if (!(port <= 65_535 && (allowZero || port > 0))) problems.push(`${name}: must be a port number${allowZero ? ' (0: any free port)' : ''}, got ${JSON.stringify(raw)}`)
  return port
}

/** Prints each problem on stderr and ends the process with `code` (2: a bad setting). */
export function refuse(problems: readonly string[], code = 2): never {
  for (const problem of problems) console.error(problem)
  process.exit(code)
}

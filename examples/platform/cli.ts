/**
 * What `npm start` (server.ts) and `npm run forward` (forwarder.ts) share on their command
 * lines: a bad option or environment variable is named on stderr, one line each, never a
 * stack trace.
 * @module
 */
import { parseArgs } from 'node:util'

/**
 * The string options `names` from the command line. Not strict, so that an unknown option, one
 * without its value or a positional argument (each added to `problems`, in parseArgs's words)
 * leaves the others to be read and checked with the rest.
 */
export function readOptions<Name extends string>(names: readonly Name[], problems: string[]): Partial<Record<Name, string>> {
  const options = Object.fromEntries(names.map((name) => [name, { type: 'string' as const }]))
  const parsed = parseArgs({ options, strict: false, allowPositionals: true })
  const known: Partial<Record<Name, string>> = {}
  for (const [name, value] of Object.entries(parsed.values)) {
    if (!(names as readonly string[]).includes(name)) problems.push(`Unknown option '--${name}'`)
    else if (typeof value !== 'string') problems.push(`Option '--${name} <value>' argument missing`)
    else known[name as Name] = value
  }
  for (const positional of parsed.positionals) problems.push(`Unexpected argument '${positional}'`)
  return known
}

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

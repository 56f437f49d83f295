/**
 * Names and sums per function for the profiling tools: `bench:profile` (perf samples) and
 * `bench:instructions -- --by-function` (callgrind's exact instruction counts, JIT-compiled
 * JavaScript named through V8's `--perf-basic-prof` map).
 */

/** `JS:*name file:///…/bundle.mjs:12:3` → `name bundle.mjs:12:3`: tier marks and long paths dropped. */
export function frameName(symbol: string): string {
  return symbol
    .replace(/^JS:[*^~+]?/, '')
    .replace(/file:\/\/\/\S*\/mcp-dispatch-bench\//, '')
    .replace(/\S*\/node_modules\//, '')
    .replace(/\s+\(\S+\)$/, '')
}

/**
 * The name lookup of a V8 `/tmp/perf-<pid>.map` (`--perf-basic-prof`): one line per code
 * object, `<start hex> <size hex> <name>`. Answers the name of the code object that starts
 * last at or before `address` and holds it, or `undefined`. Where V8 reused the memory of
 * collected code the map holds both; the later line wins for the same start (the map is only
 * ever appended to), and a newer object inside an older one's range is the one found there.
 */
export function perfMapLookup(text: string): (address: number) => string | undefined {
  const entries: { start: number; end: number; name: string }[] = []
  for (const row of text.split('\n')) {
    const match = /^([0-9a-fA-F]+) ([0-9a-fA-F]+) (.+)$/.exec(row)
    if (!match) continue
    const start = Number.parseInt(match[1]!, 16)
    entries.push({ start, end: start + Number.parseInt(match[2]!, 16), name: match[3]! })
  }
  // Stable: lines of the same start keep their order, so the later one sorts last.
  entries.sort((a, b) => a.start - b.start)
  return (address) => {
    let lo = 0
    let hi = entries.length
    while (lo < hi) {
      const mid = (lo + hi) >>> 1
      if (entries[mid]!.start <= address) lo = mid + 1
      else hi = mid
    }
    const entry = entries[lo - 1]
    return entry !== undefined && address < entry.end ? entry.name : undefined
  }
}

/**
 * Self cost (the first event, `Ir` for `callgrind --tool=callgrind`) per function of a
 * callgrind dump, call costs left out. Functions callgrind could not name (JIT-compiled
 * code: `0x…`) are named by `nameOf` where it knows the address; every name goes through
 * {@link frameName}, so a function compiled at several tiers sums to one entry.
 */
export function callgrindSelfCosts(dump: string, nameOf?: (address: number) => string | undefined): Map<string, number> {
  const names = new Map<string, string>()
  const self = new Map<string, number>()
  let current: string | undefined
  let afterCalls = false
  for (const line of dump.split('\n')) {
    const first = line.charCodeAt(0)
    if ((first >= 48 && first <= 57) || first === 43 || first === 45 || first === 42) {
      // A cost line: `<position> <Ir> …`. The one after `calls=` is the call's inclusive cost.
      if (afterCalls) {
        afterCalls = false
        continue
      }
      const cost = Number(line.split(' ')[1])
      if (current !== undefined && Number.isFinite(cost)) self.set(current, (self.get(current) ?? 0) + cost)
      continue
    }
    if (line.startsWith('calls=')) {
      afterCalls = true
      continue
    }
    // `fn=(id) name` defines a name, `fn=(id)` refers to one; `cfn=` lines define names too.
    const match = /^(c?fn)=\((\d+)\)(?: (.*))?$/.exec(line)
    if (!match) continue
    if (match[3] !== undefined) names.set(match[2]!, match[3])
    if (match[1] === 'fn') current = displayName(names.get(match[2]!) ?? `(${match[2]})`, nameOf)
  }
  return self
}

function displayName(name: string, nameOf?: (address: number) => string | undefined): string {
  if (nameOf !== undefined && /^0x[0-9a-fA-F]+$/.test(name)) {
    const known = nameOf(Number.parseInt(name.slice(2), 16))
    if (known !== undefined) return frameName(known)
  }
  return frameName(name)
}

/** The functions whose cost grew most from `base` to `other`, largest increase first. */
export function growth(
  base: ReadonlyMap<string, number>,
  other: ReadonlyMap<string, number>,
  top: number,
): { name: string; base: number; other: number }[] {
  return [...new Set([...base.keys(), ...other.keys()])]
    .map((name) => ({ name, base: base.get(name) ?? 0, other: other.get(name) ?? 0 }))
    .sort((x, y) => y.other - y.base - (x.other - x.base))
    .slice(0, top)
}

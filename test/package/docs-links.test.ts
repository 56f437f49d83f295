/**
 * Every relative link of the README and `docs/` leads somewhere: the file it names exists, and
 * the section it names (`#anchor`) is a heading of that page, by the anchors GitHub and npm give
 * headings. A renamed heading or a moved file fails here instead of leaving a reader at the top
 * of a 2,000-line page.
 */
import { existsSync, readFileSync, readdirSync } from 'node:fs'
import { dirname, join, relative, resolve } from 'node:path'
import { describe, expect, it } from 'vitest'

const root = resolve(import.meta.dirname, '../..')
const pages = ['README.md', ...readdirSync(join(root, 'docs')).filter((f) => f.endsWith('.md')).map((f) => `docs/${f}`)]

/** The page's lines outside fenced code blocks (a `# comment` in a shell sample is no heading), numbered from 1. */
function prose(text: string): { line: string; number: number }[] {
  let fenced = false
  const lines: { line: string; number: number }[] = []
  text.split('\n').forEach((line, i) => {
    // Fences indented in a list item count too.
    if (/^\s*```/.test(line)) fenced = !fenced
    else if (!fenced) lines.push({ line, number: i + 1 })
  })
  return lines
}

/**
 * The anchors of a page's headings, as GitHub's slugger makes them: the text in lower case,
 * without punctuation (letters, marks, digits, `_`, `-` and spaces stay), spaces as `-`; a
 * repeated one gets `-1`, `-2`, ….
 */
function anchorsOf(text: string): Set<string> {
  const anchors = new Set<string>()
  for (const { line } of prose(text)) {
    const heading = /^#{1,6} +(.*?)[ #]*$/.exec(line)
    if (!heading) continue
    // A link in a heading gives its text only.
    const base = heading[1]!.replace(/\[([^\]]*)\]\([^)]*\)/g, '$1').toLowerCase().replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, '').replace(/ /g, '-')
    let anchor = base
    for (let n = 1; anchors.has(anchor); n++) anchor = `${base}-${n}`
    anchors.add(anchor)
  }
  return anchors
}

/**
 * The relative links of a page's prose, with their line numbers: `[text](target)`, with or
 * without a title or angle brackets, and reference definitions (`[ref]: target`). A `](` left
 * over, a link written some other way, is returned as unreadable rather than skipped.
 */
function linksOf(text: string): { target: string; line: number }[] {
  const links: { target: string; line: number }[] = []
  for (const { line, number } of prose(text)) {
    // Inline code is no link (`[x](y)` in backticks is text).
    const code = line.replace(/`[^`]*`/g, '')
    const inline = [...code.matchAll(/\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)].map((m) => m[1]!)
    if (code.split('](').length - 1 > inline.length) links.push({ target: `unreadable link: ${line.trim()}`, line: number })
    const definition = /^ {0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?/.exec(code)
    for (const target of definition ? [...inline, definition[1]!] : inline) if (!/^[a-z][a-z0-9+.-]*:/i.test(target)) links.push({ target, line: number })
  }
  return links
}

describe('docs links', () => {
  it('finds headings by GitHub anchors, code blocks and repeats included', () => {
    const anchors = anchorsOf(
      "# Title\n## Web (Hono, Next.js, Bun)\n### What Node's parser refuses: `answerClientError`\n```sh\n# not a heading\n```\n## Web (Hono, Next.js, Bun)\n## See [stores](stores.md)\n",
    )
    expect([...anchors]).toEqual(['title', 'web-hono-nextjs-bun', 'what-nodes-parser-refuses-answerclienterror', 'web-hono-nextjs-bun-1', 'see-stores'])
  })

  it('reads links with titles, angle brackets and reference definitions, skips code and absolute URLs, and reports a link it cannot read', () => {
    const page = [
      'See [a](a.md "A") and [b](<b.md#x>), not `[c](c.md)` nor [d](https://example.com/d).',
      '[ref]: ref.md#y',
      '  ```ts',
      '  [e](e.md)',
      '  ```',
      'Odd [f]( g.md h) here.',
    ].join('\n')
    expect(linksOf(page)).toEqual([
      { target: 'a.md', line: 1 },
      { target: 'b.md#x', line: 1 },
      { target: 'ref.md#y', line: 2 },
      { target: 'unreadable link: Odd [f]( g.md h) here.', line: 6 },
    ])
  })

  /** Each linked page's anchors, read once. */
  const anchorsByFile = new Map<string, Set<string>>()
  const anchorsIn = (file: string) => anchorsByFile.get(file) ?? anchorsByFile.set(file, anchorsOf(readFileSync(file, 'utf8'))).get(file)!

  it.each(pages)('%s: every relative link names a file that exists and a heading it has', (page) => {
    const text = readFileSync(join(root, page), 'utf8')
    const broken: string[] = []
    for (const { target, line } of linksOf(text)) {
      const [path, anchor] = target.split('#') as [string, string | undefined]
      const file = path === '' ? join(root, page) : resolve(dirname(join(root, page)), decodeURI(path))
      if (!existsSync(file)) {
        broken.push(`${page}:${line}: ${target} (no ${relative(root, file)})`)
        continue
      }
      if (anchor !== undefined && !anchorsIn(file).has(decodeURIComponent(anchor))) {
        broken.push(`${page}:${line}: ${target} (no such heading in ${relative(root, file)})`)
      }
    }
    expect(broken).toEqual([])
  })
})

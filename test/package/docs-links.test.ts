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

/** The page's lines outside fenced code blocks (a `# comment` in a shell sample is no heading). */
function prose(text: string): string[] {
  let fenced = false
  return text.split('\n').filter((line) => {
    if (line.startsWith('```')) fenced = !fenced
    return !fenced && !line.startsWith('```')
  })
}

/**
 * The anchors of a page's headings, as GitHub's slugger makes them: the text in lower case,
 * without punctuation (letters, marks, digits, `_`, `-` and spaces stay), spaces as `-`; a
 * repeated one gets `-1`, `-2`, ….
 */
export function anchorsOf(text: string): Set<string> {
  const anchors = new Set<string>()
  for (const line of prose(text)) {
    const heading = /^#{1,6} +(.*?)[ #]*$/.exec(line)
    if (!heading) continue
    const base = heading[1]!.toLowerCase().replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, '').replace(/ /g, '-')
    let anchor = base
    for (let n = 1; anchors.has(anchor); n++) anchor = `${base}-${n}`
    anchors.add(anchor)
  }
  return anchors
}

/** The relative links of a page's prose (`[text](target)`), with their line numbers. */
function linksOf(text: string): { target: string; line: number }[] {
  const links: { target: string; line: number }[] = []
  let fenced = false
  text.split('\n').forEach((line, i) => {
    if (line.startsWith('```')) fenced = !fenced
    if (fenced) return
    // Inline code is no link (`[x](y)` in backticks is text).
    for (const m of line.replace(/`[^`]*`/g, '').matchAll(/\]\(([^)\s]+)\)/g)) {
      if (!/^[a-z][a-z0-9+.-]*:/i.test(m[1]!)) links.push({ target: m[1]!, line: i + 1 })
    }
  })
  return links
}

describe('docs links', () => {
  it('finds headings by GitHub anchors, code blocks and repeats included', () => {
    const anchors = anchorsOf(
      "# Title\n## Web (Hono, Next.js, Bun)\n### What Node's parser refuses: `answerClientError`\n```sh\n# not a heading\n```\n## Web (Hono, Next.js, Bun)\n",
    )
    expect([...anchors]).toEqual(['title', 'web-hono-nextjs-bun', 'what-nodes-parser-refuses-answerclienterror', 'web-hono-nextjs-bun-1'])
  })

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
      if (anchor !== undefined && !anchorsOf(readFileSync(file, 'utf8')).has(decodeURIComponent(anchor))) {
        broken.push(`${page}:${line}: ${target} (no such heading in ${relative(root, file)})`)
      }
    }
    expect(broken).toEqual([])
  })
})

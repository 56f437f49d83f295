/**
 * `new URL(input)`, or `undefined` where the URL parser refuses it. Not `URL.canParse`: Node
 * 20's, once V8 has optimised it, answers `false` for strings with Latin-1 characters that are
 * not ASCII (`http://bücher.example`), which `new URL` parses (the package's own checks go
 * through the same function, src/core/url.ts).
 */
export function parseUrl(input: string): URL | undefined {
  try {
    return new URL(input)
  } catch {
    return undefined
  }
}

'use strict';
// The README's code samples, each run as a file, as a reader saves it, on
// the Node that runs this test, against a real agent: as `.js` and `.cjs`
// (CommonJS, which the package is), and as `.mjs` with its `require` made
// the import the README names for ES modules.

const assert = require('node:assert/strict');
const { execFile } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { after, before, test } = require('node:test');
const { promisify } = require('node:util');

const { connect } = require('lockagent');
const { Agent, cleanEnv, repoRoot } = require('./harness.js');

const execFileP = promisify(execFile);
const requireLine = "const { connect } = require('lockagent');";

/** The ```js blocks of the markdown file at file, in order. */
function jsSamples(file) {
  const text = fs.readFileSync(file, 'utf8');
  return [...text.matchAll(/^```js\n([\s\S]*?)^```$/gm)].map((m) => m[1]);
}

let agent;
let dir;
before(async () => {
  agent = await Agent.start();
  // A directory of the reader's, where `lockagent` is installed: the
  // package under test (the checkout's, or the installed one).
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'la-node-readme-'));
  fs.mkdirSync(path.join(dir, 'node_modules'));
  fs.symlinkSync(path.dirname(require.resolve('lockagent/package.json')), path.join(dir, 'node_modules', 'lockagent'));
});
after(async () => {
  await agent?.stop();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
});

test('every sample of the README runs as a file', async (t) => {
  const samples = jsSamples(path.join(repoRoot, 'examples', 'node', 'README.md'));
  assert.ok(samples.length > 0, "the README's js blocks");
  const client = await connect({ socket: agent.socket });
  t.after(() => client.close());
  for (const [i, sample] of samples.entries()) {
    assert.ok(sample.startsWith(`${requireLine}\n`), `sample ${i} begins with the require that its .mjs makes an import`);
    const files = {
      [`sample${i}.js`]: sample,
      [`sample${i}.cjs`]: sample,
      [`sample${i}.mjs`]: sample.replace(requireLine, "import { connect } from 'lockagent';"),
    };
    for (const [name, code] of Object.entries(files)) {
      await t.test(name, async () => {
        fs.writeFileSync(path.join(dir, name), code);
        const { stdout, stderr } = await execFileP(process.execPath, [name], {
          cwd: dir,
          env: cleanEnv({ LOCKAGENT_SOCKET: agent.socket }),
          timeout: 30000,
        });
        assert.equal(stderr, '');
        // What it says it wrote under the lock carries the token the agent
        // granted last, and the lock is free again.
        const written = /^invoice written with fencing token (\d+)\n$/.exec(stdout);
        assert.ok(written, stdout);
        const info = await client.inspect('orders/42');
        assert.deepEqual([info.locked, info.lastToken], [false, Number(written[1])]);
      });
    }
  }
});

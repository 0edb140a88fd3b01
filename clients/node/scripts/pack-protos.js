'use strict';
/**
 * `npm pack` / `npm publish` hooks: `copy` (prepack) puts the repository's checkpoint.v1 .proto
 * files into protos/ of this package, so the tarball carries its contract; `remove` (postpack)
 * takes them out again, so a checkout keeps reading ../../protos directly (src/contract.js).
 * `copy` also refuses to pack a version other than the repository's VERSION file, the one version
 * of checkpointd, checkpointd-client and this package.
 */

const fs = require('node:fs');
const path = require('node:path');

const PACKAGE_DIR = path.resolve(__dirname, '..');
const REPOSITORY = path.resolve(PACKAGE_DIR, '..', '..');
const SOURCE = path.join(REPOSITORY, 'protos', 'checkpoint');
const TARGET = path.join(PACKAGE_DIR, 'protos', 'checkpoint');

function copy() {
  const version = fs.readFileSync(path.join(REPOSITORY, 'VERSION'), 'utf8').trim();
  const own = JSON.parse(fs.readFileSync(path.join(PACKAGE_DIR, 'package.json'), 'utf8')).version;
  if (own !== version) {
    throw new Error(`package.json has version ${own} but ${path.join(REPOSITORY, 'VERSION')} says ${version}`);
  }
  remove();
  fs.cpSync(SOURCE, TARGET, { recursive: true, filter: (p) => fs.statSync(p).isDirectory() || p.endsWith('.proto') });
}

function remove() {
  fs.rmSync(TARGET, { recursive: true, force: true });
}

const actions = { copy, remove };
const action = actions[process.argv[2]];
if (!action) {
  console.error(`usage: node scripts/pack-protos.js ${Object.keys(actions).join('|')}`);
  process.exit(2);
}
action();

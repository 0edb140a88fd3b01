'use strict';
/**
 * Two real tools acting on a plan's workspace, for the ToolRunner: local/write-file (a write
 * tool, so it is checkpointed) and local/read-file (declared read-only, so it is not).
 */

const fs = require('node:fs/promises');
const path = require('node:path');

/** The absolute path of a workspace-relative path; refuses anything that leaves the workspace. */
function insideWorkspace(workspaceRoot, relativePath) {
  if (!workspaceRoot || !path.isAbsolute(workspaceRoot)) {
    throw new Error('local file tools need an absolute workspaceRoot in their context');
  }
  const target = path.resolve(workspaceRoot, relativePath);
  const relative = path.relative(workspaceRoot, target);
  if (path.isAbsolute(relativePath) || relative === '' || relative.startsWith('..')) {
    throw new RangeError(`path ${JSON.stringify(relativePath)} is not a file inside the workspace`);
  }
  return target;
}

const writeFile = Object.freeze({
  readOnly: false,
  /** @param {{path: string, content: string}} args */
  async run(args, { workspaceRoot }) {
    const target = insideWorkspace(workspaceRoot, args.path);
    await fs.mkdir(path.dirname(target), { recursive: true });
    await fs.writeFile(target, args.content);
    return { path: args.path, bytesWritten: Buffer.byteLength(args.content) };
  },
});

const readFile = Object.freeze({
  readOnly: true,
  /** @param {{path: string}} args */
  async run(args, { workspaceRoot }) {
    return { path: args.path, content: await fs.readFile(insideWorkspace(workspaceRoot, args.path), 'utf8') };
  },
});

/** Registers local/write-file and local/read-file on a ToolRunner. */
function registerLocalFileTools(runner) {
  return runner.register('local/write-file', writeFile).register('local/read-file', readFile);
}

module.exports = { readFile, registerLocalFileTools, writeFile };

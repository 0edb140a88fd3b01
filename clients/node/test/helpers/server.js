'use strict';
/**
 * Starts a real `checkpointd serve` for the Node tests: a free TCP port on 127.0.0.1 and a unix
 * socket, a temporary --data-dir and one allowed --workspace-root, all under a fresh temp dir.
 * CHECKPOINTD_BIN overrides the binary (default: the repository's .venv).
 */

const { spawn } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { setTimeout: sleep } = require('node:timers/promises');
const { CheckpointdClient, CheckpointdError, newPlanId } = require('../../src');

const REPO = path.resolve(__dirname, '..', '..', '..', '..');
const CHECKPOINTD_BIN = process.env.CHECKPOINTD_BIN || path.join(REPO, '.venv', 'bin', 'checkpointd');
/** How long a server may take to answer its first call before the test run gives up on it. */
const STARTUP_LIMIT_MS = 60_000;

function freePort() {
  return new Promise((resolve, reject) => {
    const probe = net.createServer();
    probe.unref();
    probe.on('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address();
      probe.close(() => resolve(port));
    });
  });
}

class CheckpointdServer {
  constructor() {
    this.root = fs.mkdtempSync(path.join(os.tmpdir(), 'cpd-node-'));
    this.dataDir = path.join(this.root, 'data');
    this.allowedRoot = path.join(this.root, 'workspaces');
    this.socketPath = path.join(this.root, 'checkpointd.sock');
    fs.mkdirSync(this.dataDir);
    fs.mkdirSync(this.allowedRoot);
    this.unixTarget = `unix://${this.socketPath}`;
    this.process = null;
    this.output = '';
    this.workspaceCount = 0;
  }

  /** Starts the server (again, on the same port and paths after stop()) and waits until it answers. */
  async start() {
    if (!fs.existsSync(CHECKPOINTD_BIN)) {
      throw new Error(`checkpointd binary not found at ${CHECKPOINTD_BIN}; run \`make install\` or set CHECKPOINTD_BIN`);
    }
    this.port ??= await freePort();
    this.tcpTarget = `127.0.0.1:${this.port}`;
    const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('CHECKPOINTD_')));
    const args = [
      'serve',
      '--listen', this.tcpTarget,
      '--listen', this.unixTarget,
      '--data-dir', this.dataDir,
      '--workspace-root', this.allowedRoot,
      '--grace-seconds', '1',
    ];
    const child = spawn(CHECKPOINTD_BIN, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
    this.process = child;
    child.stdout.on('data', (chunk) => { this.output += chunk; });
    child.stderr.on('data', (chunk) => { this.output += chunk; });
    this.exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
    await this.waitUntilServing();
    return this;
  }

  async waitUntilServing() {
    const giveUpAt = Date.now() + STARTUP_LIMIT_MS;
    for (const target of [this.tcpTarget, this.unixTarget]) {
      const client = new CheckpointdClient(target, { deadlineMs: 2000 });
      try {
        for (;;) {
          if (this.process.exitCode !== null) {
            throw new Error(`checkpointd exited with ${this.process.exitCode} while starting:\n${this.output}`);
          }
          try {
            await client.listConfig();
            break;
          } catch (error) {
            if (!(error instanceof CheckpointdError) || !error.unreachable) throw error;
            if (Date.now() > giveUpAt) throw new Error(`checkpointd did not serve ${target}:\n${this.output}`);
            await sleep(100);
          }
        }
      } finally {
        client.close();
      }
    }
  }

  /** Stops the server with SIGTERM (SIGKILL if it does not go) and waits for it to exit. */
  async stop() {
    if (!this.process || this.process.exitCode !== null || this.process.signalCode !== null) return;
    this.process.kill('SIGTERM');
    const killer = setTimeout(() => this.process.kill('SIGKILL'), 15_000);
    await this.exited;
    clearTimeout(killer);
  }

  /** A fresh empty directory under the allowed workspace root. */
  newWorkspace() {
    this.workspaceCount += 1;
    const dir = path.join(this.allowedRoot, `ws-${this.workspaceCount}`);
    fs.mkdirSync(dir);
    return dir;
  }

  async cleanup() {
    await this.stop();
    fs.rmSync(this.root, { recursive: true, force: true });
  }
}

async function startServer() {
  const server = new CheckpointdServer();
  try {
    return await server.start();
  } catch (error) {
    await server.cleanup();
    throw error;
  }
}

/** Plan and checkpoint ids for the tests: the client's own generator. */
const newUlid = newPlanId;

module.exports = { CHECKPOINTD_BIN, CheckpointdServer, newUlid, startServer };
